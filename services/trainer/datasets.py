"""Real datasets in their standard on-disk forms, sampled deterministically.

* CIFAR-10 binary batches (`data_batch_1.bin` … `data_batch_5.bin`): records of 3073 bytes, a
  label byte then 1024 red, 1024 green and 1024 blue bytes of a 32×32 image, row-major.
* ImageNet-style image folders: `ROOT/<class>/<image>.jpg|.jpeg|.png` (or `ROOT/train/<class>/…`);
  classes are the sorted subfolder names; images are decoded with PIL when a batch needs them
  (as a real input pipeline does, so the data stage measures decoding) and resized to 32×32.
* WikiText raw text (`wiki.train.raw`, or a folder holding it): word-level tokens (the text is
  already split on spaces) with `<eos>` at each line end, a vocabulary of the most frequent
  words built from the text itself, the rest mapped to `<unk>`.

A dataset draws the examples of a global batch from the iteration's generator, so the data
stream still depends only on (seed, global batch, iteration): resume and resize stay exact.
Every problem raises `DatasetError` naming the path and what is wrong.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from services.trainer.errors import DatasetError

Kind = Literal["cifar10", "image-folder", "wikitext"]

CIFAR_RECORD = 3073  # 1 label byte + 3 × 32 × 32 pixel bytes
CIFAR_CLASSES = 10
IMAGE_SIZE = 32
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
WIKITEXT_SPLITS = ("wiki.train.raw", "wiki.train.tokens")
MAX_VOCAB = 10_000  # most frequent words kept; WikiText-103 has 267k
_MEAN, _STD = 0.5, 0.25  # a fixed pixel normalisation (the same for every dataset)


@dataclass(frozen=True)
class ImageData:
    """Labelled images: `batch(gen, n)` → (float images n×3×32×32, int64 labels n)."""

    path: Path
    classes: int
    size: int
    pixels: Tensor | None = None  # uint8 n×3×32×32, held in memory (CIFAR-10)
    labels: Tensor | None = None
    files: tuple[tuple[Path, int], ...] = ()  # (image file, label), decoded lazily (folders)

    def batch(self, gen: torch.Generator, n: int) -> tuple[Tensor, Tensor]:
        idx = torch.randint(0, self.size, (n,), generator=gen)
        if self.pixels is not None and self.labels is not None:
            raw, labels = self.pixels[idx], self.labels[idx]
        else:
            picked = [self.files[i] for i in idx.tolist()]
            raw = torch.stack([_decode(f) for f, _ in picked])
            labels = torch.tensor([label for _, label in picked], dtype=torch.long)
        return (raw.float() / 255.0 - _MEAN) / _STD, labels


@dataclass(frozen=True)
class TextData:
    """A token stream: `batch(gen, n)` → (inputs n×seq, next-token targets n×seq)."""

    path: Path
    tokens: Tensor  # int64, the whole split
    vocab: tuple[str, ...]
    seq: int

    def batch(self, gen: torch.Generator, n: int) -> tuple[Tensor, Tensor]:
        starts = torch.randint(0, len(self.tokens) - self.seq, (n,), generator=gen)
        windows = self.tokens[starts.unsqueeze(1) + torch.arange(self.seq + 1)]
        return windows[:, :-1], windows[:, 1:]


def detect(path: Path) -> Kind:
    """Which standard form `path` holds (raises `DatasetError` if none)."""
    if not path.exists():
        raise DatasetError(f"dataset {path}: no such file or directory")
    if path.is_file():
        if path.suffix == ".bin":
            return "cifar10"
        if path.suffix in (".raw", ".tokens", ".txt"):
            return "wikitext"
        raise DatasetError(f"dataset {path}: a file must be a CIFAR-10 .bin batch or WikiText "
                           f".raw text")
    if _cifar_files(path):
        return "cifar10"
    if _wikitext_file(path) is not None:
        return "wikitext"
    if _image_root(path) is not None:
        return "image-folder"
    raise DatasetError(
        f"dataset {path}: not a known layout (expected CIFAR-10 data_batch_N.bin files, "
        f"WikiText {' or '.join(WIKITEXT_SPLITS)}, or class subfolders of JPEG/PNG images)")


def load_images(path: Path) -> ImageData:
    kind = detect(path)
    if kind == "cifar10":
        return load_cifar10(path)
    if kind == "image-folder":
        return load_image_folder(path)
    raise DatasetError(f"dataset {path}: holds {kind} text, but this workload trains on images "
                       f"(CIFAR-10 batches or an image folder)")


def load_text(path: Path, seq: int) -> TextData:
    kind = detect(path)
    if kind != "wikitext":
        raise DatasetError(f"dataset {path}: holds {kind} images, but this workload trains on "
                           f"text (WikiText {WIKITEXT_SPLITS[0]})")
    return load_wikitext(path, seq)


# --- CIFAR-10 ----------------------------------------------------------------------------------

def _cifar_files(folder: Path) -> list[Path]:
    for where in (folder, folder / "cifar-10-batches-bin"):
        files = sorted(where.glob("data_batch_*.bin"))
        if files:
            return files
    return []


def load_cifar10(path: Path) -> ImageData:
    """Every training batch under `path` (a folder, or one `.bin` file), held in memory."""
    files = [path] if path.is_file() else _cifar_files(path)
    if not files:
        raise DatasetError(f"dataset {path}: no CIFAR-10 data_batch_N.bin files")
    chunks = []
    for f in files:
        raw = np.fromfile(f, dtype=np.uint8)
        if raw.size == 0 or raw.size % CIFAR_RECORD:
            raise DatasetError(
                f"dataset {f}: {raw.size} bytes is not a whole number of {CIFAR_RECORD}-byte "
                f"CIFAR-10 records (1 label byte + 3072 pixel bytes)")
        records = raw.reshape(-1, CIFAR_RECORD)
        bad = np.flatnonzero(records[:, 0] >= CIFAR_CLASSES)
        if bad.size:
            raise DatasetError(f"dataset {f}: record {int(bad[0])} has label "
                               f"{int(records[bad[0], 0])}; CIFAR-10 labels are 0-9")
        chunks.append(records)
    records = np.concatenate(chunks)
    pixels = torch.from_numpy(records[:, 1:].reshape(-1, 3, 32, 32).copy())
    labels = torch.from_numpy(records[:, 0].astype(np.int64))
    return ImageData(path, CIFAR_CLASSES, len(records), pixels=pixels, labels=labels)


# --- image folders -----------------------------------------------------------------------------

def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*")
                  if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _image_root(path: Path) -> Path | None:
    for root in (path / "train", path):
        if root.is_dir() and any(_images_in(c) for c in root.iterdir() if c.is_dir()):
            return root
    return None


def load_image_folder(path: Path) -> ImageData:
    """`ROOT/<class>/*.jpg`: the file list (images decode when drawn)."""
    root = _image_root(path)
    if root is None:
        raise DatasetError(f"dataset {path}: no class subfolders with JPEG/PNG images")
    classes = sorted(c for c in root.iterdir() if c.is_dir())
    files: list[tuple[Path, int]] = []
    for label, folder in enumerate(classes):
        files += [(f, label) for f in _images_in(folder)]
    if len(classes) < 2:
        raise DatasetError(f"dataset {root}: one class folder ({classes[0].name}); "
                           f"classification needs at least two")
    _decode(files[0][0])  # fail at start-up, not mid-run, on an unreadable first image
    return ImageData(path, len(classes), len(files), files=tuple(files))


def _decode(path: Path) -> Tensor:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            rgb = img.convert("RGB").resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BILINEAR)
            array = np.asarray(rgb, dtype=np.uint8)
    except (OSError, UnidentifiedImageError, SyntaxError) as exc:
        raise DatasetError(f"dataset image {path}: cannot decode: {exc}") from None
    return torch.from_numpy(array.transpose(2, 0, 1).copy())


# --- WikiText ----------------------------------------------------------------------------------

def _wikitext_file(folder: Path) -> Path | None:
    for name in WIKITEXT_SPLITS:
        if (folder / name).is_file():
            return folder / name
    return None


def tokenize(line: str) -> list[str]:
    """WikiText is pre-tokenised: words and punctuation are separated by spaces."""
    words = line.split()
    return [*words, "<eos>"] if words else []


def build_vocab(words: list[str], max_size: int = MAX_VOCAB) -> tuple[str, ...]:
    """`<unk>` first, then the most frequent words (ties alphabetical, so it is deterministic)."""
    counts = Counter(w for w in words if w != "<unk>")
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ("<unk>", *(w for w, _ in ranked[:max_size - 1]))


def load_wikitext(path: Path, seq: int) -> TextData:
    file = path if path.is_file() else _wikitext_file(path)
    if file is None:
        raise DatasetError(f"dataset {path}: no {' or '.join(WIKITEXT_SPLITS)} file")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"dataset {file}: not UTF-8 text (byte {exc.start})") from None
    words = [w for line in text.splitlines() for w in tokenize(line)]
    if len(words) <= seq + 1:
        raise DatasetError(f"dataset {file}: {len(words)} tokens; a sequence of {seq} needs "
                           f"at least {seq + 2}")
    vocab = build_vocab(words)
    index = {w: i for i, w in enumerate(vocab)}
    tokens = torch.tensor([index.get(w, 0) for w in words], dtype=torch.long)
    return TextData(file, tokens, vocab, seq)
