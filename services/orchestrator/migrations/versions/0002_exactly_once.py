"""exactly-once effects: finalisation claimed once, queue hand-offs and task deliveries recorded

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table('experiments') as batch:
        batch.add_column(sa.Column('finalize_lease_until', sa.DateTime(), nullable=True))
        batch.add_column(sa.Column('finalized_at', sa.DateTime(), nullable=True))
        batch.add_column(sa.Column('finalizations', sa.Integer(), nullable=False, server_default='0'))
    with op.batch_alter_table('scenario_runs') as batch:
        batch.add_column(sa.Column('enqueued_at', sa.DateTime(), nullable=True))
        batch.add_column(sa.Column('deliveries', sa.Integer(), nullable=False, server_default='0'))
    # experiments that finished before this revision were finalised by the code of their time
    op.execute("UPDATE experiments SET finalized_at = updated_at WHERE status IN ('succeeded', 'failed', 'cancelled')")


def downgrade() -> None:
    with op.batch_alter_table('scenario_runs') as batch:
        batch.drop_column('deliveries')
        batch.drop_column('enqueued_at')
    with op.batch_alter_table('experiments') as batch:
        batch.drop_column('finalizations')
        batch.drop_column('finalized_at')
        batch.drop_column('finalize_lease_until')
