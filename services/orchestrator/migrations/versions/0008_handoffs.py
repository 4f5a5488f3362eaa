"""handoffs: the outbox of the runs' hand-offs to the queue, written with the runs, sent by a relay

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = '0008'
down_revision: str | None = '0007'
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table('handoffs',
                    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
                    sa.Column('run_id', sa.String(length=60), nullable=False),
                    sa.Column('created_at', sa.DateTime(), nullable=False),
                    sa.ForeignKeyConstraint(['run_id'], ['scenario_runs.id'],
                                            name=op.f('fk_handoffs_run_id_scenario_runs'), ondelete='CASCADE'),
                    sa.PrimaryKeyConstraint('id', name=op.f('pk_handoffs')))
    op.create_index(op.f('ix_handoffs_run_id'), 'handoffs', ['run_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_handoffs_run_id'), table_name='handoffs')
    op.drop_table('handoffs')
