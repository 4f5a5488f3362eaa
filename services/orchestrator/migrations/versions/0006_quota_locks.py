"""quota_locks: one row per principal, locked while a submission checks its quota and inserts its runs

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table('quota_locks',
                    sa.Column('owner', sa.String(length=64), nullable=False),
                    sa.PrimaryKeyConstraint('owner', name=op.f('pk_quota_locks')))


def downgrade() -> None:
    op.drop_table('quota_locks')
