-- The user metadata a sign-in code was asked for with (`signInWithOtp({email, options: {data}})`,
-- `POST /auth/v1/otp {"data"}`): as Supabase Auth does, it becomes the metadata of the user
-- the code signs up (not of one who already has an account). Stored with the address's one
-- live code, replaced by the next code's, and cleared when a code is used.
-- Runs inside one transaction (trunk-sync migrate); must not contain BEGIN/COMMIT.
alter table otp_codes add column signup_data jsonb check (jsonb_typeof(signup_data) = 'object');
