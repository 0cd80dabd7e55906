"""The pieces of bench/gpu_validation.py, the real-GPU validation of the node agent.

- report: the report, the time budget and how one step runs within it;
- probes: the host as the harness sees it (environment, `loom doctor`, /proc, NVML);
- cluster: the live cluster the steps run on (NATS, control plane, node agent) and its taps;
- records: what the trainers' protocol records say about a job;
- steps: what each step does (the GPU backend, families, preemption, MPS);
- run: the steps in order, within the budget, and the teardown.
"""
