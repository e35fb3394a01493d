-- Rate limits (issue 18): `{rpm?, tpm?}` on an API key and on the tenant (its ceiling over all
-- its keys and routes), validated by shield-core before they are stored. NULL: no limit.
-- Route limits live in the route's body.

ALTER TABLE api_keys ADD COLUMN limits JSONB;
ALTER TABLE tenants ADD COLUMN limits JSONB;
