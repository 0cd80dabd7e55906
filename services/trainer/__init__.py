"""The trainer wrapper: one rank of a real PyTorch data-parallel job, launched by a node agent.

`python -m services.trainer --job-id J --model cnn --iterations N --checkpoint-dir DIR ...`
trains a small workload family on synthetic data, writes the progress protocol
(`protocol.py`) as JSON lines, checkpoints on SIGTERM and resumes (also at another world size).
Pure parts: `catalog`, `config`, `protocol`, `accounting`, `checkpoint` (format and rules),
`workloads`, `textprogress` (progress printed by unmodified jobs); the shell: `shell` (signals,
exit codes), `channel` (the report channel), `comm` (process group), `runner` (the loop).
The trainer SDK (`loom.sdk`, docs/sdk.md) writes the same protocol and checkpoint format.
"""
