-- Stored Responses-API responses (issue 29): how long the data plane keeps a response sent
-- with `store: true`, per tenant. 0 keeps nothing; the default is a day.

ALTER TABLE tenants ADD COLUMN responses_retention_s INTEGER NOT NULL DEFAULT 86400
    CHECK (responses_retention_s >= 0);
