"""Turn run logs (verl's file-logger ``metrics.jsonl``, either backend) into tables and figures.

Reads files only: pandas, numpy, pyarrow, matplotlib, seaborn, pyyaml and `rla`, never a training backend,
so it runs on a laptop with logs copied from a cluster.

- :mod:`analysis.load`: runs directory -> per-run frames, the tidy long table.
- :mod:`analysis.collapse`: the collapse definition and the stability table.
- :mod:`analysis.figures`: the figures; :mod:`analysis.tables`: the model x ablation summary.
- ``python -m analysis {collect,stability,plots,all}``: see :mod:`analysis.cli`. The studies (studies/)
  read these tables and figures; nothing here imports a study.
"""
