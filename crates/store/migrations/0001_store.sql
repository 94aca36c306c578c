-- Hearth's shared store (crates/store/src/postgres.rs). Money is NUMERIC (exact), never float;
-- every money movement locks the user's balances row (SELECT ... FOR UPDATE) for its whole
-- transaction, and the CHECK constraints are the last line: no balance is ever below zero.

CREATE TABLE users (
    user_id      TEXT PRIMARY KEY,
    is_marketing BOOLEAN NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL
);

CREATE TABLE balances (
    user_id TEXT PRIMARY KEY REFERENCES users (user_id),
    balance NUMERIC NOT NULL CHECK (balance >= 0)
);

-- Append-only. `seq` is taken after the balance row is locked, so one user's rows are in the
-- order their transactions committed and each `balance_after` is the running total.
CREATE TABLE ledger (
    seq            BIGSERIAL PRIMARY KEY,
    user_id        TEXT NOT NULL REFERENCES users (user_id),
    amount         NUMERIC NOT NULL,
    balance_after  NUMERIC NOT NULL CHECK (balance_after >= 0),
    reason         TEXT NOT NULL,
    developer_id   TEXT,
    application_id TEXT,
    at             TIMESTAMPTZ NOT NULL
);
CREATE INDEX ledger_by_user ON ledger (user_id, seq);

-- Open holds only: settling or releasing deletes the row, in the transaction that moves the
-- money, which is what makes it exactly-once.
CREATE TABLE holds (
    id             BIGSERIAL PRIMARY KEY,
    user_id        TEXT NOT NULL REFERENCES users (user_id),
    amount         NUMERIC NOT NULL CHECK (amount >= 0),
    balance_before NUMERIC NOT NULL,
    reason         TEXT NOT NULL,
    developer_id   TEXT,
    application_id TEXT,
    node_id        TEXT NOT NULL,
    placed_at      TIMESTAMPTZ NOT NULL
);
CREATE INDEX holds_by_user ON holds (user_id);
CREATE INDEX holds_by_node ON holds (node_id);

CREATE TABLE revoked_tokens (
    jti        TEXT PRIMARY KEY,
    expires_at TIMESTAMPTZ NOT NULL
);

CREATE TABLE idp_sessions (
    idp_token_id TEXT NOT NULL,
    jti          TEXT NOT NULL,
    expires_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (idp_token_id, jti)
);

CREATE TABLE idp_revoked (
    idp_token_id TEXT PRIMARY KEY,
    expires_at   TIMESTAMPTZ NOT NULL
);

-- Values every node shares, written once by the first node (the service-token and identity
-- provider secrets).
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
