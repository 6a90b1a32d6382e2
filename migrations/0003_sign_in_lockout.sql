-- Wrong sign-in codes counted per address across codes, and the lock they lead to.
-- Runs inside one transaction (trunk-sync migrate); must not contain BEGIN/COMMIT.
--
-- `attempts` counts wrong guesses at one code and starts over with every new code, so on
-- its own it allowed 5 guesses a minute for ever. These columns survive new codes (the
-- upsert of /otp leaves them alone): TRUNK_SYNC_OTP_FAILURE_LIMIT refused /verify requests
-- (default 10 per hour) lock verification for the address for TRUNK_SYNC_OTP_LOCKOUT
-- seconds (default an hour), the right code included.
alter table otp_codes
  add column failures       integer not null default 0,  -- refused /verify requests in the window
  add column failures_since timestamptz,                 -- start of the window (the first of them)
  add column locked_until   timestamptz;                 -- /verify refuses every code until then
