"""The training engine: K runs of one cell trained as one stacked model, each handed back as the run it is.

- :mod:`.stack` — the K backbones as one: flat stacked weights, a ``torch.func.vmap`` forward, each run's model a
  view of its row; :func:`.stack.stack_reason` says in one line why a model cannot stack;
- :mod:`.optim` — Adam(W) over the stack, each run at its own learning rate and schedule;
- :mod:`.step` — the train step on the device: per-run loss over a static-shape batch, divergence, metrics summed
  on the device, the whole step capturable as one CUDA graph;
- :mod:`.data` — the K runs' batches, stacked, their epochs resident on the device;
- :mod:`.loop` — :func:`.loop.train_stacked`: the epochs, validation and checkpoints; each run's record (summary,
  TensorBoard, resume) written by the plain run's own code (:mod:`ablations.training`, ``ConvergenceTracker``);
- :func:`.loop.cell_key` — what may stack: runs whose configs differ only in seed, learning rates and weight decay;
- :mod:`.choice` — which engine trains a cell: stacked on CUDA, on a CPU only where it measured faster;
- :mod:`.measure` — the levers' train-step timings (``python -m ablations.bench --sections engine``).

A study's waiting trials are claimed by cell and trained as stacks by :mod:`ablations.run.stacked` (``ablations.run
--engine``), which uses this package (no module here imports from ``ablations.run``). ``docs/gpu-engine.md`` has the
measurements behind the design and how a GPU run uses it.
"""
