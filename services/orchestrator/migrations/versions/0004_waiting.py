"""waiting: a run records the outage it waits out

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table('scenario_runs') as batch:
        batch.add_column(sa.Column('waiting_reason', sa.Text(), nullable=True))
        batch.add_column(sa.Column('waiting_since', sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('scenario_runs') as batch:
        batch.drop_column('waiting_since')
        batch.drop_column('waiting_reason')
