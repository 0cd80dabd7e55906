"""Real datasets in their on-disk forms: files written here byte for byte, then trained on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from schemas.trainer import Failed
from services.trainer import datasets, workloads
from services.trainer.accounting import STREAM, derive_seed
from services.trainer.errors import DatasetError
from tests.services.trainer.proc import launch

# --- builders: the standard formats, written from scratch --------------------------------------


def write_cifar_batches(folder: Path, records: int = 40, files: int = 2, seed: int = 0) -> Path:
    """`cifar-10-batches-bin/data_batch_N.bin`: label byte + 3072 pixel bytes (R, G, B planes)."""
    out = folder / "cifar-10-batches-bin"
    out.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for n in range(1, files + 1):
        labels = rng.integers(0, 10, records, dtype=np.uint8)
        # A learnable signal: each class has its own mean brightness.
        pixels = np.clip(labels[:, None] * 20 + rng.integers(0, 40, (records, 3072)), 0, 255)
        rows = np.concatenate([labels[:, None], pixels.astype(np.uint8)], axis=1)
        (out / f"data_batch_{n}.bin").write_bytes(rows.astype(np.uint8).tobytes())
    return folder


def write_image_folder(folder: Path, classes: tuple[str, ...] = ("cat", "dog", "fish"),
                       per_class: int = 4, size: tuple[int, int] = (40, 28)) -> Path:
    """`train/<class>/<n>.jpg|png` as ImageNet's layout, mixed formats and sizes."""
    rng = np.random.default_rng(1)
    for c, name in enumerate(classes):
        d = folder / "train" / name
        d.mkdir(parents=True)
        for i in range(per_class):
            array = rng.integers(0, 60, (*size[::-1], 3)) + 60 * c
            img = Image.fromarray(array.astype(np.uint8), "RGB")
            img.save(d / (f"{i}.png" if i % 2 else f"{i}.JPEG"))
    return folder


# WikiText's own shape: lines start and end with a space; blank lines between sections.
WIKI = "".join(f"{line} \n" for line in (
    " = Valkyria Chronicles III =",
    "",
    " Senjō no Valkyria 3 : <unk> Chronicles is a tactical role @-@ playing video game .",
    " The game began development in 2010 , carrying over a large portion of the work .",
    "",
    " = = Gameplay = =",
    "",
    " As with previous <unk> Chronicles games , the game is a tactical role @-@ playing game .",
))


def write_wikitext(folder: Path, repeat: int = 20) -> Path:
    """`wikitext-2-raw/wiki.train.raw`: space-separated tokens, ` = Heading = ` lines."""
    out = folder / "wikitext-2-raw"
    out.mkdir(parents=True)
    (out / "wiki.train.raw").write_text(WIKI * repeat, encoding="utf-8")
    return out


# --- reading -----------------------------------------------------------------------------------


def test_cifar_records_decode_to_their_labels_and_planes(tmp_path: Path) -> None:
    root = tmp_path / "c"
    root.mkdir()
    out = root / "data_batch_1.bin"
    pixels = np.zeros((2, 3, 32, 32), dtype=np.uint8)
    pixels[0, 0] = 255  # record 0: all red
    pixels[1, 2, 5, 7] = 9  # record 1: one blue pixel at row 5, column 7
    out.write_bytes(bytes([3]) + pixels[0].tobytes() + bytes([7]) + pixels[1].tobytes())
    data = datasets.load_cifar10(root)
    assert data.size == 2 and data.classes == 10
    assert data.labels is not None and data.labels.tolist() == [3, 7]
    assert data.pixels is not None
    assert int(data.pixels[0, 0].min()) == 255 and int(data.pixels[0, 1:].max()) == 0
    assert int(data.pixels[1, 2, 5, 7]) == 9 and int(data.pixels[1].sum()) == 9


def test_image_folder_classes_are_sorted_subfolders(tmp_path: Path) -> None:
    data = datasets.load_image_folder(write_image_folder(tmp_path))
    assert data.classes == 3 and data.size == 12
    assert [label for _, label in data.files] == [0] * 4 + [1] * 4 + [2] * 4
    images, labels = data.batch(torch.Generator().manual_seed(0), 5)
    assert images.shape == (5, 3, 32, 32) and labels.shape == (5,)


def test_wikitext_vocabulary_is_built_from_the_text(tmp_path: Path) -> None:
    data = datasets.load_text(write_wikitext(tmp_path), seq=8)
    assert data.vocab[0] == "<unk>"
    assert {"<eos>", "Valkyria", "@-@", "="} <= set(data.vocab)
    assert len(set(data.vocab)) == len(data.vocab)
    words = [w for line in (WIKI * 20).splitlines() for w in datasets.tokenize(line)]
    assert len(data.tokens) == len(words)
    inputs, targets = data.batch(torch.Generator().manual_seed(0), 4)
    assert inputs.shape == targets.shape == (4, 8)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are the next tokens


def test_vocabulary_caps_at_the_most_frequent_words() -> None:
    vocab = datasets.build_vocab(["b", "a", "b", "c", "c", "c", "<unk>"], max_size=3)
    assert vocab == ("<unk>", "c", "b")


@pytest.mark.parametrize("kind", ["cifar", "images", "wikitext"])
def test_batches_depend_only_on_the_iteration(tmp_path: Path, kind: str) -> None:
    path, model = _dataset(tmp_path, kind)
    a, b = workloads.make(model, 0, path), workloads.make(model, 5, path)
    gen: Callable[[int], torch.Generator] = \
        lambda i: torch.Generator().manual_seed(derive_seed(0, STREAM, i))  # noqa: E731
    for x, y in zip(a.make_batch(gen(3), 6), b.make_batch(gen(3), 6), strict=True):
        assert torch.equal(x, y)


# --- errors ------------------------------------------------------------------------------------


def _corrupt_cifar(tmp: Path) -> Path:
    (tmp / "data_batch_1.bin").write_bytes(bytes(3073 * 2 + 100))
    return tmp


def _bad_label(tmp: Path) -> Path:
    (tmp / "data_batch_1.bin").write_bytes(bytes([0]) + bytes(3072) + bytes([12]) + bytes(3072))
    return tmp


def _one_class(tmp: Path) -> Path:
    return write_image_folder(tmp, classes=("only",))


def _broken_image(tmp: Path) -> Path:
    write_image_folder(tmp)
    first = sorted((tmp / "train" / "cat").iterdir())[0]
    first.write_bytes(b"not a jpeg")
    return tmp


def _short_text(tmp: Path) -> Path:
    (tmp / "wiki.train.raw").write_text(" a b c \n")
    return tmp


def _latin1_text(tmp: Path) -> Path:
    (tmp / "wiki.train.raw").write_bytes("caf\xe9 ".encode("latin-1") * 50)
    return tmp


def _empty_dir(tmp: Path) -> Path:
    return tmp


ERRORS = [
    ("missing", lambda t: t / "nope", "cnn", "no such file or directory"),
    ("not a multiple of 3073", _corrupt_cifar, "cnn", "not a whole number of 3073-byte"),
    ("label out of range", _bad_label, "cnn", "record 1 has label 12"),
    ("one class", _one_class, "cnn", "classification needs at least two"),
    ("undecodable image", _broken_image, "cnn", "cannot decode"),
    ("too few tokens", _short_text, "transformer", "tokens; a sequence of 32 needs"),
    ("not utf-8", _latin1_text, "transformer", "not UTF-8"),
    ("unknown layout", _empty_dir, "cnn", "not a known layout"),
    ("images for a text model", lambda t: write_cifar_batches(t), "transformer",
     "this workload trains on text"),
    ("text for an image model", lambda t: write_wikitext(t), "cnn", "trains on images"),
    ("no real-data form", lambda t: write_wikitext(t), "lstm", "has only synthetic data"),
]


@pytest.mark.parametrize(("case", "build", "model", "message"), ERRORS,
                         ids=[e[0] for e in ERRORS])
def test_bad_datasets_say_what_and_where(tmp_path: Path, case: str,
                                         build: Callable[[Path], Path], model: str,
                                         message: str) -> None:
    path = build(tmp_path)
    with pytest.raises(DatasetError, match=message) as err:
        workloads.make(model, 0, path)
    assert str(tmp_path) in str(err.value)


# --- training ----------------------------------------------------------------------------------


def _dataset(tmp: Path, kind: str) -> tuple[Path, str]:
    if kind == "cifar":
        return write_cifar_batches(tmp), "cnn"
    if kind == "images":
        return write_image_folder(tmp), "cnn"
    return write_wikitext(tmp), "transformer"


@pytest.mark.parametrize("kind", ["cifar", "images", "wikitext"])
def test_real_iterations_lower_the_loss(tmp_path: Path, kind: str) -> None:
    path, model = _dataset(tmp_path, kind)
    work = workloads.make(model, 0, path)
    net = work.init_model(0)
    opt = work.optimizer(net)
    losses = []
    for i in range(30):
        batch = work.make_batch(torch.Generator().manual_seed(derive_seed(0, STREAM, i)), 16)
        opt.zero_grad()
        loss = work.loss(net, batch)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        losses.append(loss.item())
    assert all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < np.mean(losses[:5])


def test_trainer_process_trains_on_cifar_and_refuses_a_corrupt_file(tmp_path: Path) -> None:
    data = write_cifar_batches(tmp_path / "cifar")
    ok = launch(tmp_path, "ok", "--job-id", "c1", "--model", "cnn", "--iterations", "6",
                "--checkpoint-dir", str(tmp_path / "ck1"), "--data", str(data),
                "--batch-size", "8")
    bad_file = tmp_path / "bad" / "data_batch_1.bin"
    bad_file.parent.mkdir()
    bad_file.write_bytes(bytes(5000))
    bad = launch(tmp_path, "bad", "--job-id", "c2", "--model", "cnn", "--iterations", "6",
                 "--checkpoint-dir", str(tmp_path / "ck2"), "--data", str(bad_file.parent))
    assert ok.wait() == 0, ok.stderr()
    finished = ok.of("finished")
    assert finished and finished[0].iteration == 6
    assert bad.wait() == 2
    failed = bad.of("failed")
    assert failed and isinstance(failed[0], Failed)
    assert str(bad_file) in failed[0].reason and "3073" in failed[0].reason
