"""The Trunk apps' code paths, run with the real supabase-py client against trunk-sync.

Usage: supabase_flow.py BASE_URL MAIL_DIR
MAIL_DIR is where the test's SMTP sink writes each received message (one file each); the
sign-in code is read from the mail, as a user would.
Prints one "ok <step>" line per step; exits non-zero with the failing step on error.
"""
import email
import glob
import os
import re
import sys
import time
import uuid

from postgrest.exceptions import APIError
from supabase import create_client

base_url, mail_dir = sys.argv[1], sys.argv[2]
address = f"py-{uuid.uuid4().hex[:8]}@example.com"


def step(name):
    print("ok", name, flush=True)


def read_code(to, seen):
    deadline = time.time() + 20
    while time.time() < deadline:
        for path in sorted(glob.glob(os.path.join(mail_dir, "*.eml"))):
            if path in seen:
                continue
            with open(path, "rb") as handle:
                message = email.message_from_binary_file(handle)
            if to not in (message.get("To") or ""):
                continue
            seen.add(path)
            part = message.get_payload(decode=True) if not message.is_multipart() else message.get_payload(0).get_payload(decode=True)
            found = re.search(r"\b(\d{6})\b", part.decode("utf-8"))
            if found:
                return found.group(1)
        time.sleep(0.05)
    raise SystemExit("no sign-in mail arrived for " + to)


client = create_client(base_url, "anon-key")
seen = set()

# options.data is the new user's metadata, as Supabase Auth makes it.
client.auth.sign_in_with_otp({"email": address, "options": {"should_create_user": True, "data": {"full_name": "Py", "theme": "dark"}}})
code = read_code(address, seen)
step("sign_in_with_otp (code read from the mail)")

verified = client.auth.verify_otp({"email": address, "token": code, "type": "email"})
assert verified.session is not None and verified.user is not None, verified
user_id = verified.user.id
first_access = verified.session.access_token
assert verified.user.user_metadata.get("full_name") == "Py", verified.user.user_metadata
step("verify_otp (the sign-up's data is the user's metadata)")


def event(client_id=None, kind="sprout_planted", payload=None):
    return {
        "user_id": str(user_id),
        "type": kind,
        "payload": payload if payload is not None else {"a": 1},
        "client_id": client_id or str(uuid.uuid4()),
        "client_timestamp": "2026-11-22T04:10:02.123Z",
    }


one = event(payload={"text": "ünïcødé 🌱", "n": [1, 2.5]})
inserted = client.table("events").insert(one).execute()
assert len(inserted.data) == 1 and inserted.data[0]["client_id"] == one["client_id"], inserted.data
assert inserted.data[0]["payload"] == one["payload"], inserted.data
step("insert one")

# The web app's migrate-to-cloud upload: one row is already synced.
two, three = event(), event()
batch = client.table("events").insert([one, two, three]).execute()
assert sorted(row["client_id"] for row in batch.data) == sorted([two["client_id"], three["client_id"]]), batch.data
step("insert a batch of three with one duplicate")

rows = client.table("events").select("*").order("created_at", desc=False).execute().data
assert [row["client_id"] for row in rows] == [one["client_id"], two["client_id"], three["client_id"]], rows
step("select ordered by created_at")

rest = client.table("events").select("*").order("created_at", desc=False).gt("created_at", rows[0]["created_at"]).execute().data
assert [row["client_id"] for row in rest] == [two["client_id"], three["client_id"]], rest
step("select gt the first row's created_at")

# Outside the REST subset: refused naming what, not taken for a missing column (42703).
for name, query in [
    ("match", lambda: client.table("events").select("*").filter("type", "match", "^a")),
]:
    try:
        query().execute()
        raise SystemExit(f"{name} was not refused")
    except APIError as error:
        assert error.code == "PGRST100", (name, error.code, error.message)
        assert error.message in (f"The {name} filter is not supported by this server.",
                                 f"The {name} operator is not supported by this server."), (name, error.message)
step("match refused with PGRST100 naming it")

upserted = client.table("events").upsert([one], on_conflict="client_id", ignore_duplicates=True).execute()
assert upserted.data == [], upserted.data
assert len(client.table("events").select("id").execute().data) == 3
step("upsert ignore_duplicates")

# in_ (values with a comma or parenthesis quoted by the client) and is_.
client.table("events").insert([event(kind="weeded (bed 3, north)"), event(kind='said "hi"')]).execute()
chosen = client.table("events").select("client_id,type").in_("type", ["weeded (bed 3, north)", "nothing"]).execute().data
assert [row["type"] for row in chosen] == ["weeded (bed 3, north)"], chosen
chosen = client.table("events").select("type").in_("type", ['said "hi"', "nothing"]).execute().data
assert chosen == [{"type": 'said "hi"'}], chosen
chosen = client.table("events").select("seq").in_("client_id", [one["client_id"], three["client_id"]]).order("seq").execute().data
assert len(chosen) == 2, chosen
assert client.table("events").select("seq").is_("type", "null").execute().data == []
unnamed = client.table("profiles").select("full_name").is_("full_name", "null").execute().data
assert unnamed == [], unnamed  # named "Py" at sign-up
step("in_ and is_ filters")

# not_ before any operator, like and ilike (`%` as the apps write it, or PostgREST's `*`).
types = lambda query: sorted(row["type"] for row in query.execute().data)
every = types(client.table("events").select("type"))
assert len(every) == 5, every
assert types(client.table("events").select("type").not_.is_("type", "null")) == every
assert types(client.table("events").select("type").like("type", "weeded%")) == ["weeded (bed 3, north)"]
assert types(client.table("events").select("type").like("type", "weeded*")) == ["weeded (bed 3, north)"]
assert types(client.table("events").select("type").ilike("type", "%SAID%")) == ['said "hi"']
assert types(client.table("events").select("type").like("type", "%SAID%")) == []
assert types(client.table("events").select("type").not_.ilike("type", "sprout%")) == sorted(
    ["weeded (bed 3, north)", 'said "hi"'])
assert types(client.table("events").select("type").not_.in_("type", ["sprout_planted", 'said "hi"'])) == [
    "weeded (bed 3, north)"]
assert types(client.table("events").select("type").not_.eq("type", "sprout_planted")) == sorted(
    ["weeded (bed 3, north)", 'said "hi"'])
named = client.table("profiles").select("full_name").not_.is_("full_name", "null").execute().data
assert named == [{"full_name": "Py"}], named
step("not_, like and ilike filters")

# or_ (a value with a comma or parenthesis quoted, as the PostgREST grammar wants), nested.
assert types(client.table("events").select("type").or_('type.eq."weeded (bed 3, north)",type.like.said*')) == sorted(
    ["weeded (bed 3, north)", 'said "hi"'])
assert types(client.table("events").select("type").or_("type.eq.nothing,and(type.like.sprout*,seq.gt.1)")) == [
    "sprout_planted", "sprout_planted"]
assert types(client.table("events").select("type").not_.is_("type", "null").or_("seq.lt.0,seq.gt.1000")) == []
step("or_ filters")

updated = client.auth.update_user({"data": {"full_name": "Alice", "theme": None}})
assert "theme" not in updated.user.user_metadata, updated.user.user_metadata
assert client.auth.get_user().user.user_metadata.get("full_name") == "Alice"
profile = client.table("profiles").select("full_name").eq("id", user_id).single().execute()
assert profile.data == {"full_name": "Alice"}, profile.data
step("profiles select full_name single() after update_user")

client.table("profiles").update({"full_name": "B"}).eq("id", user_id).execute()
profile = client.table("profiles").select("full_name").eq("id", user_id).single().execute()
assert profile.data["full_name"] == "B", profile.data
step("update the profile")

refreshed = client.auth.refresh_session()
assert refreshed.session is not None and refreshed.session.refresh_token != verified.session.refresh_token
step("refresh_session")

client.auth.sign_out()
assert client.auth.get_session() is None
step("sign_out")
