"""The trainer wrapper: one rank of a real PyTorch data-parallel job, launched by a node agent.

`python -m services.trainer --job-id J --model cnn --iterations N --checkpoint-dir DIR ...`
trains a small workload family on synthetic data, writes the progress protocol
(`schemas.trainer`) as JSON lines, checkpoints on SIGTERM and resumes (also at another world
size). Pure parts: `accounting` (stage times, report windows, seeds), `checkpoint` (format and
rules), `workloads`, `datasets`, `optim`; the shell: `shell` (arguments, exit codes),
`stopping` (SIGTERM/SIGINT), `channel` (the report channel), `comm` (process group), `runner`
(the loop). `reporting` writes a launch's records and checkpoints; the trainer SDK
(`loom.sdk`, docs/sdk.md) uses it, `stopping`, `channel` and `environment` (what its launcher
tells it), so both write the same protocol and checkpoint format.
"""
