"""Wire contracts between services (pydantic v2). Events cross the wire columnar: one list per field."""
