//! What dlm keeps in the database: its schema (tables, a sequence, functions), written
//! once here, and the statements that call it.
//!
//! Every operation is one call of a PL/pgSQL function: one round trip, one implicit
//! transaction, whatever the function does inside it. The leases expire on the server's
//! clock (`clock_timestamp()`).

/// The version of the schema below: an older one is replaced at first use.
pub(crate) const VERSION: i32 = 9;

/// The advisory lock that installations of the schema take, one at a time.
pub(crate) const INSTALL_LOCK: i64 = 7162534413490182231;

/// The schema, `$S` standing for the schema's quoted name and `$C` for the notification
/// channel. Run as one simple query (one transaction), under an advisory lock so that two
/// processes installing it at once do not collide (`Schema::ensure` takes the lock first
/// and installs only when the version it then finds is older).
const SCHEMA: &str = r#"
SELECT pg_advisory_xact_lock(7162534413490182231);
CREATE SCHEMA IF NOT EXISTS $S;

-- Leases live in UNLOGGED tables: no WAL, no fsync per acquisition. A crash (and a
-- standby's promotion) empties them; the hold-back below covers that.
-- A row outlives its holds: a release marks it free (owner '', expires -infinity), and
-- the sweep deletes rows free or expired for a minute (see `Statements::acquire` for why
-- tokens need that). `waited_until`: someone waits for its release until then.
CREATE UNLOGGED TABLE IF NOT EXISTS $S.locks (
    name text PRIMARY KEY,
    owner text NOT NULL,
    expires timestamptz NOT NULL,
    token bigint NOT NULL,
    waited_until timestamptz,
    -- Set by the release that freed the row: whether the hold was live then, and
    -- whether someone waited (read back by that release, in the same statement).
    ended_live boolean,
    ended_waited boolean
);
ALTER TABLE $S.locks ADD COLUMN IF NOT EXISTS waited_until timestamptz;
ALTER TABLE $S.locks ADD COLUMN IF NOT EXISTS ended_live boolean;
ALTER TABLE $S.locks ADD COLUMN IF NOT EXISTS ended_waited boolean;
-- The holders of semaphores ('s') and read-write locks ('r').
CREATE UNLOGGED TABLE IF NOT EXISTS $S.holds (
    name text NOT NULL,
    kind "char" NOT NULL,
    owner text NOT NULL,
    write boolean NOT NULL,
    expires timestamptz NOT NULL,
    token bigint NOT NULL,
    label text,
    PRIMARY KEY (name, kind, owner)
);
-- A semaphore's permit count, a read-write lock's waiting writer.
CREATE UNLOGGED TABLE IF NOT EXISTS $S.groups (
    name text NOT NULL,
    kind "char" NOT NULL,
    permits integer NOT NULL DEFAULT 0,
    writer_until timestamptz,
    PRIMARY KEY (name, kind)
);
-- Someone waits for a release of (name, kind) until `until`: the release notifies.
CREATE UNLOGGED TABLE IF NOT EXISTS $S.waiting (
    name text NOT NULL,
    kind "char" NOT NULL,
    until timestamptz NOT NULL,
    PRIMARY KEY (name, kind)
);
-- One row while the unlogged tables have not been emptied since it was written, read by
-- every acquisition. Written only when an epoch opens: a row updated every second leaves
-- a chain of dead versions that every read walks until the page is pruned (measured:
-- about a fifth of the throughput at 8 threads). `held_until`: the durable mark when the
-- epoch opened (no longer read; kept for clients of schema 8 and older).
CREATE UNLOGGED TABLE IF NOT EXISTS $S.epoch (
    id integer PRIMARY KEY CHECK (id = 1),
    since timestamptz NOT NULL,
    closed_until timestamptz,
    held_until timestamptz
);
ALTER TABLE $S.epoch ADD COLUMN IF NOT EXISTS held_until timestamptz;
-- Logged: the latest end of any lease granted, plus slack, made durable before the
-- grant is answered. A new epoch grants nothing before it.
CREATE TABLE IF NOT EXISTS $S.settings (
    id integer PRIMARY KEY CHECK (id = 1),
    version integer NOT NULL,
    held_until timestamptz NOT NULL
);
-- Fencing tokens: logged, set forward to the server's clock in microseconds at every new
-- epoch, so they never go back.
CREATE SEQUENCE IF NOT EXISTS $S.tokens;
INSERT INTO $S.settings VALUES (1, 0, '-infinity') ON CONFLICT (id) DO NOTHING;

DROP FUNCTION IF EXISTS $S.acquire(text, text, bigint);
DROP FUNCTION IF EXISTS $S.acquire_group(text, "char", boolean, integer, text, bigint, bigint, text);
DROP FUNCTION IF EXISTS $S.inspect_group(text, "char");
DROP FUNCTION IF EXISTS $S.release(text, text, text);

CREATE OR REPLACE FUNCTION $S.ms(d interval) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $f$ SELECT greatest(ceil(extract(epoch FROM d) * 1000), 0)::bigint $f$;

-- The current epoch's hold-back: until when it grants nothing (NULL: it grants).
CREATE OR REPLACE FUNCTION $S.open(p_now timestamptz) RETURNS timestamptz
LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    v_closed timestamptz;
    v_held timestamptz;
BEGIN
    SELECT e.closed_until INTO v_closed FROM $S.epoch e WHERE e.id = 1;
    IF FOUND THEN
        RETURN v_closed;
    END IF;
    -- One opening at a time: an opening that found no epoch row while another was under
    -- way, and set the sequence forward after that one had committed and tokens had been
    -- drawn, would set it back. The one that waited finds the epoch open (a new snapshot).
    PERFORM pg_advisory_xact_lock(7162534413490182232);
    SELECT e.closed_until INTO v_closed FROM $S.epoch e WHERE e.id = 1;
    IF FOUND THEN
        RETURN v_closed;
    END IF;
    -- A new epoch: the server crashed, a standby was promoted, or this is the first use.
    SELECT s.held_until INTO v_held FROM $S.settings s WHERE s.id = 1;
    PERFORM set_config('synchronous_commit', 'on', true);
    PERFORM setval('$S.tokens', greatest(
        (SELECT last_value FROM $S.tokens),
        (extract(epoch FROM p_now) * 1000000)::bigint));
    INSERT INTO $S.epoch VALUES (1, p_now, CASE WHEN v_held > p_now THEN v_held END, v_held)
        ON CONFLICT (id) DO NOTHING;
    SELECT e.closed_until INTO v_closed FROM $S.epoch e WHERE e.id = 1;
    RETURN v_closed;
END $f$;

-- Records, durably, that a lease may last until p_until (plus a second of slack, so that
-- the logged row is written at most about once a second, not per grant). Answers the
-- durable mark, in whole microseconds since 1970 rounded down: a client that knows it
-- need not raise it for a lease of the same epoch that ends no later.
CREATE OR REPLACE FUNCTION $S.keep_mark(p_until timestamptz) RETURNS bigint
LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    v_held timestamptz;
BEGIN
    SELECT s.held_until INTO v_held FROM $S.settings s WHERE s.id = 1;
    IF p_until > v_held THEN
        PERFORM set_config('synchronous_commit', 'on', true);
        UPDATE $S.settings SET held_until = greatest(held_until, p_until + interval '1 s')
            WHERE id = 1 RETURNING held_until INTO v_held;
    END IF;
    RETURN floor(extract(epoch FROM v_held) * 1000000)::bigint;
END $f$;

-- The same, answering nothing (what the functions below and clients of schema 8 call).
CREATE OR REPLACE FUNCTION $S.keep(p_until timestamptz) RETURNS void
LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM $S.keep_mark(p_until);
END $f$;

-- A failed attempt at (name, kind) that will look again within p_wait.
CREATE OR REPLACE FUNCTION $S.wait(p_name text, p_kind "char", p_until timestamptz)
RETURNS void LANGUAGE sql AS $f$
    INSERT INTO $S.waiting VALUES (p_name, p_kind, p_until)
    ON CONFLICT (name, kind) DO UPDATE SET until = greatest($S.waiting.until, excluded.until)
$f$;

-- Wakes the waiters of (name, kind), if any: a notification at commit.
CREATE OR REPLACE FUNCTION $S.wake(p_name text, p_kind "char", p_sender text, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $f$
#variable_conflict use_column
BEGIN
    IF EXISTS (SELECT 1 FROM $S.waiting w
               WHERE w.name = p_name AND w.kind = p_kind AND w.until > p_now) THEN
        PERFORM pg_notify('$C', p_sender || ' ' || p_kind::text || ' ' || p_name);
    END IF;
END $f$;

-- Tells the listeners of (name, kind) that its holders changed, whether or not anyone
-- waits: a one-permit semaphore is an election, whose observers follow every change.
CREATE OR REPLACE FUNCTION $S.announce(p_name text, p_kind "char", p_sender text)
RETURNS void LANGUAGE sql AS $f$
    SELECT pg_notify('$C', p_sender || ' ' || p_kind::text || ' ' || p_name)
$f$;

-- An acquisition that the one statement of `Statements::acquire` did not grant: the epoch
-- opened if it is new, and when to look again (at once if the epoch just opened without
-- a hold-back, or the row was freed meanwhile), with the mark that someone waits for its
-- release.
CREATE OR REPLACE FUNCTION $S.acquire_slow(p_name text, p_owner text, p_ttl bigint,
    OUT granted boolean, OUT token bigint, OUT wait_ms bigint)
LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_closed timestamptz;
    v_other timestamptz;
BEGIN
    granted := false;
    SELECT e.closed_until INTO v_closed FROM $S.epoch e WHERE e.id = 1;
    IF NOT FOUND THEN
        v_closed := $S.open(v_now);
        wait_ms := $S.ms(greatest(coalesce(v_closed, v_now), v_now) - v_now);
        RETURN;
    END IF;
    IF v_closed > v_now THEN
        wait_ms := $S.ms(v_closed - v_now);
        RETURN;
    END IF;
    UPDATE $S.locks l SET waited_until = greatest(l.waited_until, l.expires + interval '1 s')
        WHERE l.name = p_name RETURNING l.expires INTO v_other;
    -- (Freed meanwhile: -infinity, or gone: look again at once.)
    wait_ms := $S.ms(greatest(coalesce(v_other, v_now), v_now) - v_now);
END $f$;

CREATE OR REPLACE FUNCTION $S.extend(p_name text, p_owner text, p_ttl bigint) RETURNS bigint
LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_exp timestamptz := v_now + p_ttl * interval '1 ms';
    v_token bigint;
BEGIN
    UPDATE $S.locks l SET expires = v_exp
        WHERE l.name = p_name AND l.owner = p_owner AND l.expires > v_now
        RETURNING l.token INTO v_token;
    IF FOUND THEN
        PERFORM $S.keep(v_exp);
    END IF;
    RETURN v_token;
END $f$;

-- Every renewal of a round in one call: kind 'm' (mutex), 's' or 'r'. Answers the
-- (1-based) positions renewed, with their tokens.
CREATE OR REPLACE FUNCTION $S.extend_many(p_kinds "char"[], p_names text[], p_owners text[],
    p_ttls bigint[])
RETURNS TABLE (i integer, token bigint)
LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    RETURN QUERY
    WITH r AS (
        SELECT * FROM unnest(p_kinds, p_names, p_owners, p_ttls) WITH ORDINALITY
            AS r(kind, name, owner, ttl, i)
    ), m AS (
        UPDATE $S.locks l SET expires = v_now + r.ttl * interval '1 ms' FROM r
        WHERE r.kind = 'm' AND l.name = r.name AND l.owner = r.owner AND l.expires > v_now
        RETURNING r.i::integer AS i, l.token
    ), g AS (
        UPDATE $S.holds h SET expires = v_now + r.ttl * interval '1 ms' FROM r
        WHERE r.kind <> 'm' AND h.name = r.name AND h.kind = r.kind AND h.owner = r.owner
            AND h.expires > v_now
        RETURNING r.i::integer AS i, h.token
    )
    SELECT * FROM m UNION ALL SELECT * FROM g;
    IF FOUND THEN
        PERFORM $S.keep(v_now + (SELECT max(t) FROM unnest(p_ttls) t) * interval '1 ms');
    END IF;
END $f$;

CREATE OR REPLACE FUNCTION $S.force_release(p_name text, p_sender text)
RETURNS boolean LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_live boolean;
    v_waited boolean;
BEGIN
    WITH old AS (
        SELECT l.expires, l.waited_until FROM $S.locks l
        WHERE l.name = p_name AND l.owner <> '' FOR NO KEY UPDATE
    )
    UPDATE $S.locks l SET owner = '', expires = '-infinity', waited_until = NULL FROM old
        WHERE l.name = p_name
        RETURNING old.expires > v_now, old.waited_until > v_now INTO v_live, v_waited;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_waited THEN
        PERFORM pg_notify('$C', p_sender || ' m ' || p_name);
    END IF;
    RETURN v_live;
END $f$;

CREATE OR REPLACE FUNCTION $S.inspect(p_name text) RETURNS bigint
LANGUAGE sql AS $f$
    SELECT $S.ms(l.expires - clock_timestamp()) FROM $S.locks l
    WHERE l.name = p_name AND l.expires > clock_timestamp()
$f$;

CREATE OR REPLACE FUNCTION $S.fence(p_name text, p_owner text) RETURNS bigint
LANGUAGE sql AS $f$
    SELECT l.token FROM $S.locks l
    WHERE l.name = p_name AND l.owner = p_owner AND l.expires > clock_timestamp()
$f$;

-- The group row of (name, kind), locked: every operation on a group takes it first, so
-- that two of them never wait for each other's rows in opposite orders.
CREATE OR REPLACE FUNCTION $S.group_row(p_name text, p_kind "char")
RETURNS $S.groups LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    v_g $S.groups;
BEGIN
    LOOP
        SELECT * INTO v_g FROM $S.groups g WHERE g.name = p_name AND g.kind = p_kind
            FOR UPDATE;
        IF FOUND THEN
            RETURN v_g;
        END IF;
        INSERT INTO $S.groups (name, kind) VALUES (p_name, p_kind) ON CONFLICT DO NOTHING;
    END LOOP;
END $f$;

-- An attempt at a group hold. `conflict`: the permit count the semaphore is held with,
-- when it is not p_permits (nothing was done).
CREATE OR REPLACE FUNCTION $S.acquire_group(p_name text, p_kind "char", p_write boolean,
    p_permits integer, p_owner text, p_ttl bigint, p_mark bigint, p_label text,
    p_sender text,
    OUT granted boolean, OUT token bigint, OUT wait_ms bigint, OUT conflict integer)
LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_exp timestamptz := v_now + p_ttl * interval '1 ms';
    v_closed timestamptz := $S.open(v_now);
    v_g $S.groups;
    v_count integer;
    v_soonest timestamptz;
    v_writer timestamptz;
BEGIN
    granted := false;
    IF v_closed > v_now THEN
        wait_ms := $S.ms(v_closed - v_now);
        RETURN;
    END IF;
    v_g := $S.group_row(p_name, p_kind);
    SELECT count(*), min(h.expires), min(h.expires) FILTER (WHERE h.write)
        INTO v_count, v_soonest, v_writer
        FROM $S.holds h WHERE h.name = p_name AND h.kind = p_kind AND h.expires > v_now;
    IF p_kind = 's' AND v_count > 0 AND v_g.permits <> p_permits THEN
        conflict := v_g.permits;
        RETURN;
    END IF;
    -- Ours already (a retry after a lost reply): refreshed.
    UPDATE $S.holds h SET expires = v_exp
        WHERE h.name = p_name AND h.kind = p_kind AND h.owner = p_owner AND h.expires > v_now
        RETURNING h.token INTO token;
    IF FOUND THEN
        granted := true;
        PERFORM $S.keep(v_exp);
        RETURN;
    END IF;
    IF p_kind = 's' THEN
        IF v_count >= p_permits THEN
            wait_ms := $S.ms(v_soonest - v_now);
        END IF;
    ELSIF NOT p_write THEN
        IF v_writer IS NOT NULL THEN
            wait_ms := $S.ms(v_writer - v_now);
        ELSIF v_g.writer_until > v_now THEN
            wait_ms := $S.ms(v_g.writer_until - v_now);
        END IF;
    ELSIF v_count > 0 THEN
        -- Others inside: new readers wait behind this writer from now on, while it comes
        -- back before its mark ends.
        UPDATE $S.groups g SET writer_until = v_now + p_mark * interval '1 ms'
            WHERE g.name = p_name AND g.kind = p_kind;
        wait_ms := least($S.ms(v_soonest - v_now), p_mark / 3);
    END IF;
    IF wait_ms IS NOT NULL THEN
        PERFORM $S.wait(p_name, p_kind, v_now + (wait_ms + 1000) * interval '1 ms');
        RETURN;
    END IF;
    INSERT INTO $S.holds AS h VALUES (p_name, p_kind, p_owner, p_write, v_exp,
        nextval('$S.tokens'), p_label)
        ON CONFLICT (name, kind, owner) DO UPDATE SET write = excluded.write,
            expires = excluded.expires, token = excluded.token, label = excluded.label
        RETURNING h.token INTO token;
    UPDATE $S.groups g SET
        permits = CASE WHEN p_kind = 's' THEN p_permits ELSE g.permits END,
        writer_until = CASE WHEN p_write THEN NULL ELSE g.writer_until END
        WHERE g.name = p_name AND g.kind = p_kind;
    granted := true;
    PERFORM $S.keep(v_exp);
    IF p_kind = 's' AND p_permits = 1 THEN
        PERFORM $S.announce(p_name, p_kind, p_sender); -- a new leader
    END IF;
END $f$;

CREATE OR REPLACE FUNCTION $S.release_group(p_name text, p_kind "char", p_owner text,
    p_sender text)
RETURNS boolean LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_live boolean;
    v_g $S.groups := $S.group_row(p_name, p_kind);
BEGIN
    DELETE FROM $S.holds h WHERE h.name = p_name AND h.kind = p_kind AND h.owner = p_owner
        RETURNING h.expires > v_now INTO v_live;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_kind = 's' AND v_g.permits = 1 THEN
        PERFORM $S.announce(p_name, p_kind, p_sender);
    ELSE
        PERFORM $S.wake(p_name, p_kind, p_sender, v_now);
    END IF;
    RETURN v_live;
END $f$;

CREATE OR REPLACE FUNCTION $S.force_release_group(p_name text, p_kind "char", p_sender text)
RETURNS boolean LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_g $S.groups := $S.group_row(p_name, p_kind);
    v_live boolean;
BEGIN
    WITH d AS (
        DELETE FROM $S.holds h WHERE h.name = p_name AND h.kind = p_kind
        RETURNING h.expires > v_now AS live
    ) SELECT coalesce(bool_or(d.live), false) INTO v_live FROM d;
    UPDATE $S.groups g SET writer_until = NULL, permits = 0
        WHERE g.name = p_name AND g.kind = p_kind;
    IF p_kind = 's' AND v_g.permits = 1 THEN
        PERFORM $S.announce(p_name, p_kind, p_sender);
    ELSE
        PERFORM $S.wake(p_name, p_kind, p_sender, v_now);
    END IF;
    RETURN v_live OR coalesce(v_g.writer_until > v_now, false);
END $f$;

CREATE OR REPLACE FUNCTION $S.downgrade(p_name text, p_writer text, p_reader text,
    p_ttl bigint, p_sender text)
RETURNS bigint LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_exp timestamptz := v_now + p_ttl * interval '1 ms';
    v_token bigint;
BEGIN
    PERFORM $S.group_row(p_name, 'r');
    UPDATE $S.holds h SET owner = p_reader, write = false, expires = v_exp
        WHERE h.name = p_name AND h.kind = 'r' AND h.owner = p_writer AND h.write
            AND h.expires > v_now
        RETURNING h.token INTO v_token;
    IF FOUND THEN
        PERFORM $S.keep(v_exp);
        PERFORM $S.wake(p_name, 'r', p_sender, v_now);
    END IF;
    RETURN v_token;
END $f$;

CREATE OR REPLACE FUNCTION $S.fence_group(p_name text, p_kind "char", p_owner text)
RETURNS bigint LANGUAGE sql AS $f$
    SELECT h.token FROM $S.holds h
    WHERE h.name = p_name AND h.kind = p_kind AND h.owner = p_owner
        AND h.expires > clock_timestamp()
$f$;

-- Sets the label of p_owner's live hold (an election leader's new value), and announces
-- it. Whether it holds.
CREATE OR REPLACE FUNCTION $S.relabel_group(p_name text, p_kind "char", p_owner text,
    p_label text, p_sender text)
RETURNS boolean LANGUAGE plpgsql AS $f$
#variable_conflict use_column
BEGIN
    UPDATE $S.holds h SET label = p_label
        WHERE h.name = p_name AND h.kind = p_kind AND h.owner = p_owner
            AND h.expires > clock_timestamp();
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM $S.announce(p_name, p_kind, p_sender);
    RETURN true;
END $f$;

-- Who holds a group: one row per live holder, with the permit count and its token.
CREATE OR REPLACE FUNCTION $S.inspect_group(p_name text, p_kind "char")
RETURNS TABLE (write boolean, remaining_ms bigint, label text, permits integer, token bigint)
LANGUAGE sql AS $f$
    SELECT h.write, $S.ms(h.expires - clock_timestamp()), h.label, g.permits, h.token
    FROM $S.holds h JOIN $S.groups g ON g.name = h.name AND g.kind = h.kind
    WHERE h.name = p_name AND h.kind = p_kind AND h.expires > clock_timestamp()
$f$;

-- Deletes what expired a minute ago or more: nobody renews it, and every operation
-- treats it as absent already.
CREATE OR REPLACE FUNCTION $S.sweep() RETURNS void
LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    v_old timestamptz := clock_timestamp() - interval '1 minute';
BEGIN
    DELETE FROM $S.locks l
        WHERE l.expires < v_old AND coalesce(l.waited_until < v_old, true);
    DELETE FROM $S.holds h WHERE h.expires < v_old;
    DELETE FROM $S.waiting w WHERE w.until < v_old;
    DELETE FROM $S.groups g
        WHERE coalesce(g.writer_until < v_old, true)
          AND NOT EXISTS (SELECT 1 FROM $S.holds h WHERE h.name = g.name AND h.kind = g.kind);
END $f$;

UPDATE $S.settings SET version = $V WHERE id = 1;
"#;

/// The schema's SQL for the schema named `schema` (already checked: lower-case letters,
/// digits and `_`), its notification channel `channel`.
pub(crate) fn schema_sql(schema: &str, channel: &str) -> String {
    SCHEMA
        .replace("$S", &format!("\"{schema}\""))
        .replace("$C", channel)
        .replace("$V", &VERSION.to_string())
}

/// The statements an operation sends, for the schema named `schema`.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) version: String,
    pub(crate) acquire: String,
    pub(crate) acquire_slow: String,
    pub(crate) keep: String,
    pub(crate) extend: String,
    pub(crate) extend_many: String,
    pub(crate) release: String,
    pub(crate) force_release: String,
    pub(crate) inspect: String,
    pub(crate) fence: String,
    pub(crate) acquire_group: String,
    pub(crate) release_group: String,
    pub(crate) force_release_group: String,
    pub(crate) downgrade: String,
    pub(crate) fence_group: String,
    pub(crate) inspect_group: String,
    pub(crate) relabel_group: String,
    pub(crate) sweep: String,
}

impl Statements {
    pub(crate) fn new(schema: &str, channel: &str) -> Statements {
        // An epoch's start as both the acquisition and `keep` answer it (whole µs): the
        // backend compares the two, so they are one expression.
        const EPOCH_START: &str = "(extract(epoch FROM since) * 1000000)::int8";
        let s = format!("\"{schema}\"");
        Statements {
            version: format!("SELECT version FROM {s}.settings WHERE id = 1"),
            // The name's row inserted, or, if it exists, taken where it is free (released
            // or expired) or this owner's already (a retry after a lost reply, which keeps
            // its token), unless the epoch holds grants back: one statement. Taking an
            // existing row draws its token while the row is locked (PostgreSQL evaluates
            // `DO UPDATE` on the locked row, again on a row changed meanwhile), so a later
            // holder, which can only take the row after this one commits, draws a larger
            // token. A new row's token is drawn just before its insertion; a row is not
            // deleted at its release but marked free, and deleted by the sweep a minute
            // after its last hold ended, so an insertion that draws a smaller token than
            // an earlier holder of the name would have to stall for that minute between
            // its draw and its insertion. Answers the token, the lease's end (in whole
            // microseconds, rounded up) and the epoch's start, which the backend compares
            // with the durable mark `keep_mark` last answered in that epoch (raised
            // before the grant is answered when the lease may outlast it). No row back:
            // `acquire_slow`.
            acquire: format!(
                "WITH e AS (SELECT closed_until, since FROM {s}.epoch WHERE id = 1) \
                 INSERT INTO {s}.locks AS l (name, owner, expires, token) \
                 SELECT $1, $2, clock_timestamp() + $3 * interval '1 ms', \
                 nextval('{s}.tokens') \
                 WHERE EXISTS (SELECT 1 FROM e \
                   WHERE e.closed_until IS NULL OR e.closed_until <= clock_timestamp()) \
                 ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, \
                 expires = excluded.expires, \
                 token = CASE WHEN l.owner = excluded.owner THEN l.token \
                   ELSE nextval('{s}.tokens') END \
                 WHERE l.owner = excluded.owner OR l.expires <= clock_timestamp() \
                 RETURNING l.token, ceil(extract(epoch FROM l.expires) * 1000000)::int8, \
                 (SELECT {EPOCH_START} FROM e)"
            ),
            acquire_slow: format!("SELECT * FROM {s}.acquire_slow($1, $2, $3)"),
            // The mark, and the epoch of the server that answered it: behind a pooler the
            // statement may reach another server than the grant did.
            keep: format!(
                "SELECT {s}.keep_mark(clock_timestamp() + $1 * interval '1 ms'), \
                 (SELECT {EPOCH_START} FROM {s}.epoch \
                 WHERE id = 1)"
            ),
            extend: format!("SELECT {s}.extend($1, $2, $3)"),
            extend_many: format!("SELECT * FROM {s}.extend_many($1, $2, $3, $4)"),
            // The row marked free if it is this owner's; whether the hold was live, and
            // a notification at commit when someone waits. No row back: not ours.
            release: format!(
                "UPDATE {s}.locks SET owner = '', expires = '-infinity', \
                   waited_until = NULL, ended_live = expires > clock_timestamp(), \
                   ended_waited = coalesce(waited_until > clock_timestamp(), false) \
                 WHERE name = $1 AND owner = $2 RETURNING ended_live, \
                   CASE WHEN ended_waited THEN pg_notify('{channel}', $3 || ' m ' || $1) END \
                   IS NOT NULL AS notified"
            ),
            force_release: format!("SELECT {s}.force_release($1, $2)"),
            inspect: format!("SELECT {s}.inspect($1)"),
            fence: format!("SELECT {s}.fence($1, $2)"),
            acquire_group: format!(
                "SELECT * FROM {s}.acquire_group($1, $2, $3, $4, $5, $6, $7, $8, $9)"
            ),
            release_group: format!("SELECT {s}.release_group($1, $2, $3, $4)"),
            force_release_group: format!("SELECT {s}.force_release_group($1, $2, $3)"),
            downgrade: format!("SELECT {s}.downgrade($1, $2, $3, $4, $5)"),
            fence_group: format!("SELECT {s}.fence_group($1, $2, $3)"),
            inspect_group: format!("SELECT * FROM {s}.inspect_group($1, $2)"),
            relabel_group: format!("SELECT {s}.relabel_group($1, $2, $3, $4, $5)"),
            sweep: format!("SELECT {s}.sweep()"),
        }
    }
}
