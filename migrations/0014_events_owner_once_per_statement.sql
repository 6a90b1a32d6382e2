-- The events owner policy's user, computed once per statement instead of once per row.
-- Runs inside one transaction (trunk-sync migrate); must not contain BEGIN/COMMIT.
--
-- The policy's USING clause (0001) compared every row read with
-- nullif(current_setting('app.user_id', true), '')::uuid: a setting looked up by name and a
-- uuid parsed per row, 1,000 times for a page of a pull. Written as a scalar subquery, the
-- same expression is an InitPlan: evaluated once when the statement starts, then compared
-- as a constant. current_setting() is stable, so within one statement the value is the
-- same either way: the rows a statement may see do not change. Measured with pgbench on
-- the pull's own statements (bench/sync's pull_transaction.sql, 1,000 events a page):
-- PostgreSQL's CPU per pull 1,634–1,762 µs instead of 2,005–2,079.
--
-- An insert with RETURNING checks each new row against this USING too, where the subquery
-- costs more than the expression (+4 % per 100-event push): the push's insert has no
-- RETURNING. WITH CHECK stays as it was (the same change measured no gain there).
alter policy events_owner on events
  using (user_id = (select nullif(current_setting('app.user_id', true), '')::uuid));
