"""an Idempotency-Key is unique per principal, not across all of them

A key one principal used no longer refuses another's submission (which also told the caller that the key existed):
the unique constraint moves from ``idempotency_key`` to ``(owner, idempotency_key)``.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from alembic import op

revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table('experiments') as batch:
        batch.drop_constraint('uq_experiments_idempotency_key', type_='unique')
        batch.create_unique_constraint('uq_experiments_owner_idempotency_key', ['owner', 'idempotency_key'])


def downgrade() -> None:
    with op.batch_alter_table('experiments') as batch:
        batch.drop_constraint('uq_experiments_owner_idempotency_key', type_='unique')
        batch.create_unique_constraint('uq_experiments_idempotency_key', ['idempotency_key'])
