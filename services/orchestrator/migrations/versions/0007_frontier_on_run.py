"""runs keep their frontier; the windows table goes (the loop commits control epochs, the series is a run file)

A run's frontier (the states the next window starts from, whole) is saved on its row with each epoch's commit; the
per-window metrics are in the run's folder (``runs/<scenario>/windows.jsonl.gz``), so the windows table, ~31 kB a
window and 1.3 GB for one default experiment, is dropped. Unfinished runs lose the frontier the table held: they
start over from window 0 (their files are rewritten from the start).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = '0007'
down_revision: str | None = '0006'
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table('scenario_runs') as batch:
        batch.add_column(sa.Column('frontier', sa.JSON(none_as_null=True), nullable=True))
    op.execute("UPDATE scenario_runs SET next_window = 0 WHERE status IN ('queued', 'running')")
    op.drop_table('windows')


def downgrade() -> None:
    op.create_table(
        'windows',
        sa.Column('run_id', sa.String(length=60), nullable=False),
        sa.Column('window', sa.Integer(), autoincrement=False, nullable=False),
        sa.Column('snapshot', sa.JSON(), nullable=False),
        sa.Column('metrics', sa.JSON(), nullable=False),
        sa.Column('frontier', sa.JSON(none_as_null=True), nullable=True),
        sa.Column('worker', sa.String(length=200), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(['run_id'], ['scenario_runs.id'], name=op.f('fk_windows_run_id_scenario_runs'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('run_id', 'window', name=op.f('pk_windows')))
    with op.batch_alter_table('scenario_runs') as batch:
        batch.drop_column('frontier')
