"""What a job asked for in sbatch's terms beyond device memory: host memory (``host_mem``,
bytes, the job's cgroup limit), CPUs per task (``cpus``), a begin time (``begin_time``), a
GPU type (``gpu_type``, matched to device models), a signal before the time limit
(``warn_signal``, sbatch's ``--signal`` as ``[B:]NUMBER@SECONDS``), and the output patterns
as given (``output_pattern``, ``error_pattern``: ``%x-%j.out``, for export; the resolved
paths stay in ``stdout_path``/``stderr_path``).

Jobs from before keep NULL in each: no host-memory limit, no CPU count, no begin time, any
device, no signal; export rebuilds their patterns from the resolved paths as before.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa

from gq.migrations import columns

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None
_COLUMNS = (
    ("host_mem", sa.Integer),
    ("cpus", sa.Integer),
    ("begin_time", sa.Float),
    ("gpu_type", sa.Text),
    ("warn_signal", sa.String(32)),
    ("output_pattern", sa.Text),
    ("error_pattern", sa.Text),
)


def upgrade() -> None:
    columns.add("jobs", _COLUMNS)


def downgrade() -> None:
    columns.drop("jobs", _COLUMNS)
