"""windows: the JSON columns compressed with lz4 on PostgreSQL (the cluster's window commit)

A window's row (the thermal snapshot and the metrics, ~33 kB of JSON, and the frontier) is compressed as PostgreSQL
moves it out of line. pglz, the default, cost the server 1.4-1.6 ms of CPU per window commit; lz4 0.50-0.55 ms, the
commit's wall time 2.2-2.4 -> 1.2-1.4 ms, for 16 % more bytes on disk (25.6 -> 29.8 MB per 1000 windows; the same
rows committed 1000 times through `repository.commit_window`, two runs each, alternated).

Only where PostgreSQL can (14 and newer built with lz4: Debian's packages and the official images are); elsewhere,
and on SQLite, nothing changes. Rows written before keep their compression (PostgreSQL reads both).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | None = None
depends_on: str | None = None

COLUMNS = ('snapshot', 'metrics', 'frontier')


def lz4_available(bind: sa.Connection) -> bool:
    """PostgreSQL that offers lz4 for TOAST (the setting's choices list it only when built with it; none before 14)."""
    if bind.dialect.name != 'postgresql':
        return False
    row = bind.execute(sa.text("SELECT 'lz4' = ANY(enumvals) FROM pg_settings "
                               "WHERE name = 'default_toast_compression'")).first()
    return bool(row and row[0])


def upgrade() -> None:
    bind = op.get_bind()
    if lz4_available(bind):
        for col in COLUMNS:
            op.execute(f'ALTER TABLE windows ALTER COLUMN {col} SET COMPRESSION lz4')


def downgrade() -> None:
    bind = op.get_bind()
    if lz4_available(bind):
        for col in COLUMNS:
            op.execute(f'ALTER TABLE windows ALTER COLUMN {col} SET COMPRESSION default')
