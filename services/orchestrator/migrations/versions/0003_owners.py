"""owners: experiments and sweeps belong to the API key's principal

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table('experiments') as batch:
        batch.add_column(sa.Column('owner', sa.String(length=64), nullable=False, server_default='local'))
        batch.create_index(batch.f('ix_experiments_owner'), ['owner'], unique=False)
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('owner', sa.String(length=64), nullable=False, server_default='local'))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('owner')
    with op.batch_alter_table('experiments') as batch:
        batch.drop_index(batch.f('ix_experiments_owner'))
        batch.drop_column('owner')
