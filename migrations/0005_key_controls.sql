-- Keys a team can hand out (issue 32): a route allow-list (names and `*` patterns; NULL: every
-- route), an expiry, a monthly budget `{monthly, action}`, a small string map of metadata, and
-- the previous secret of a rotated key with the end of its grace. The operator's monthly cap
-- on a tenant. Audit rows gain details (a key's name and metadata; never a secret).

ALTER TABLE api_keys ADD COLUMN routes TEXT[];
ALTER TABLE api_keys ADD COLUMN expires_at TIMESTAMPTZ;
ALTER TABLE api_keys ADD COLUMN budget JSONB;
ALTER TABLE api_keys ADD COLUMN metadata JSONB NOT NULL DEFAULT '{}'::jsonb;
ALTER TABLE api_keys ADD COLUMN previous_key_hash TEXT;
ALTER TABLE api_keys ADD COLUMN previous_until TIMESTAMPTZ;
ALTER TABLE api_keys ADD COLUMN rotated_at TIMESTAMPTZ;

ALTER TABLE tenants ADD COLUMN budget JSONB;

ALTER TABLE audit_log ADD COLUMN details JSONB;
