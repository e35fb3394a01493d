-- Webhooks: where a tenant's events (budget_exceeded, gateway_target_down) are delivered, and
-- a record of every delivery attempt. The signing secret is stored encrypted like a vault
-- secret (AES-256-GCM, AAD = tenant + "webhook:" + id) and shown once, at creation.

CREATE TABLE webhooks (
    id                UUID PRIMARY KEY,
    tenant_id         BIGINT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    url               TEXT NOT NULL,
    events            TEXT[] NOT NULL,
    allow_private     BOOLEAN NOT NULL DEFAULT false,
    secret_ciphertext BYTEA NOT NULL,
    secret_nonce      BYTEA NOT NULL,
    secret_key_version INTEGER NOT NULL,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX webhooks_tenant ON webhooks (tenant_id);

CREATE TABLE webhook_deliveries (
    id          BIGSERIAL PRIMARY KEY,
    webhook_id  UUID NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    delivery_id TEXT NOT NULL,            -- X-Shield-Delivery: the same for every attempt
    event_type  TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    status      INTEGER,                  -- the receiver's HTTP status, when it answered
    error       TEXT,                     -- why it failed (timeout, connection), never a secret
    outcome     TEXT NOT NULL CHECK (outcome IN ('delivered', 'retrying', 'failed')),
    at          TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX webhook_deliveries_webhook ON webhook_deliveries (webhook_id, id DESC);
