"""Slurm both ways: sbatch's options beside gq's (:mod:`~gq.slurm.options`), the
environment sbatch gives a job (:mod:`~gq.slurm.environment`), an ``srun`` for inside a gq
job (the ``bin/srun`` shim), and gq jobs written out as sbatch scripts
(:mod:`~gq.slurm.export`). Pure code: the CLI and the daemon do the I/O."""
