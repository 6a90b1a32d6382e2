-- Sign-in's look-up of an address in users, through an index under row-level security.
-- Runs inside one transaction (trunk-sync migrate); must not contain BEGIN/COMMIT.
--
-- Every POST /auth/v1/otp asks, as the server's role, whether its address has an account.
-- Written `lower(email) = $1`, that condition cannot use users_email_key (on lower(email)):
-- lower() is not leakproof, so PostgreSQL applies the table's policies first, and their OR
-- (the owner's id or address, or a live console session) matches no index. Every /otp read
-- every users row (measured: 140 ms at 100,000 users, growing with them; bench/auth).
-- Addresses are stored lower-cased (the check on users.email), so `email = $1` finds the
-- same row, and = on text is leakproof: with this index, the look-up reads that one row and
-- the policies filter only it.

create index users_email_idx on users (email);
