"""The trainer wrapper: one rank of a real PyTorch data-parallel job, launched by a node agent.

`python -m services.trainer --job-id J --model cnn --iterations N --checkpoint-dir DIR ...`
trains a small workload family on synthetic data, writes the progress protocol
(`protocol.py`) as JSON lines, checkpoints on SIGTERM and resumes (also at another world size).
Pure parts: `catalog`, `config`, `protocol`, `accounting`, `checkpoint` (format and rules),
`workloads`; the shell: `shell` (signals, report channel, exit codes), `comm` (process group),
`runner` (the loop).
"""
