-- capvend ledger, schema 5, PostgreSQL (see ../0005_request_replies.sql).
-- Not money: rows past the window are pruned.
CREATE TABLE request_replies (
	request_key TEXT   PRIMARY KEY,
	reply       BYTEA  NOT NULL,
	created_at  BIGINT NOT NULL
);

CREATE INDEX request_replies_created ON request_replies (created_at);
