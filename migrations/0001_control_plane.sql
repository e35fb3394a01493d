-- Shield control plane. Postgres is the source of truth for configuration; Redis holds what is
-- published from here. Every tenant-owned row carries tenant_id and every query filters on it.

CREATE TABLE tenants (
    id             BIGSERIAL PRIMARY KEY,
    slug           TEXT NOT NULL UNIQUE,
    name           TEXT NOT NULL,
    -- Strictly increasing with every committed config write; the snapshot carries it and the
    -- republisher compares it with what Redis holds.
    config_version BIGINT NOT NULL DEFAULT 0,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE admin_users (
    id            UUID PRIMARY KEY,
    tenant_id     BIGINT REFERENCES tenants (id) ON DELETE CASCADE,
    email         TEXT NOT NULL UNIQUE,
    password_hash TEXT NOT NULL,          -- argon2id PHC string
    role          TEXT NOT NULL CHECK (role IN ('owner', 'admin', 'viewer', 'operator')),
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE targets (
    tenant_id  BIGINT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id         TEXT NOT NULL,
    body       JSONB NOT NULL,            -- validated by shield-core; never holds a secret
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id)
);

CREATE TABLE routes (
    tenant_id  BIGINT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name       TEXT NOT NULL,
    body       JSONB NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name)
);

CREATE TABLE secrets (
    tenant_id   BIGINT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    ciphertext  BYTEA NOT NULL,           -- AES-256-GCM, AAD = tenant slug + name
    nonce       BYTEA NOT NULL,
    key_version INTEGER NOT NULL,
    bindings    TEXT[] NOT NULL,
    hint        TEXT,                     -- at most the last 4 characters, for long values only
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name)
);

CREATE TABLE api_keys (
    id         UUID PRIMARY KEY,
    tenant_id  BIGINT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name       TEXT NOT NULL,
    key_hash   TEXT NOT NULL UNIQUE,      -- SHA-256 hex; the key itself is never stored
    prefix     TEXT NOT NULL,             -- first characters, to recognise a key in a list
    agent      TEXT,
    role       TEXT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at TIMESTAMPTZ
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);

CREATE TABLE guardrail_policies (
    tenant_id  BIGINT PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    body       JSONB NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE audit_log (
    id            BIGSERIAL PRIMARY KEY,
    tenant_id     BIGINT REFERENCES tenants (id) ON DELETE CASCADE,
    actor         TEXT NOT NULL,
    action        TEXT NOT NULL,
    object        TEXT NOT NULL,
    before_digest TEXT,                   -- SHA-256 of the object before; never a secret value
    after_digest  TEXT,
    at            TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX audit_log_tenant_at ON audit_log (tenant_id, at DESC);
