-- Every statement sqllock sends, each under a "-- name:" marker. The Go side
-- splits this file once, puts the configured table name in place of
-- `sqllock`, and prepares each statement once per Client.
--
-- A name has two rows (schema.sql): its lease ('L'), which Release deletes,
-- and its fence ('F'), which outlives every release so that fences keep
-- growing across release and re-acquire. Once adds a third, its completion
-- record ('D'); no other statement reads or writes it.
--
-- A lease row may end with its holder's session instead of by its own
-- expiry. Such a lease is attached: its expires_at is
-- '9999-12-31 23:59:59.999999', the greatest DATETIME(6), and it lasts
-- while its session lasts: the row of kind 'S' whose name is the first 16
-- characters of the lease's owner, by that row's expires_at; with no such
-- row it has ended. A session row's fence counts the changes others made to
-- its leases (lock_delay). Every statement here that decides whether
-- another owner's lease lives, or shows how long it lasts, reads an
-- attached lease so: the lease's end is
--   IF(l.expires_at = '9999-12-31 23:59:59.999999',
--      COALESCE((SELECT s.expires_at FROM `sqllock` AS s
--                WHERE s.name = LEFT(l.owner, 16) AND s.kind = 'S'), '1000-01-01'),
--      l.expires_at)
-- (in an upsert's update, l is the table's own name: its owner, not the
-- session row's). The IF reads the session row only for an attached lease,
-- and is NULL where the lease is (a LEFT JOIN that found none).
-- A reader that knows nothing of sessions (a release of sqllock before
-- this one; TiDB's and Vitess's one-row forms, which the Client never
-- attaches) finds an attached lease live for ever: it never takes one
-- early, and waits longer than it need for the names of a holder that
-- died. Of the holder's own statements, refresh reads the session and
-- detaches the lease; renew_many and renew_found pass an attached lease
-- by; check and release need no expiry (check passes an attached lease
-- while its owner is the token: its write holds off any takeover until
-- the transaction ends). A set's leases are attached as a name's is: its
-- all_refresh reads the session and detaches them, all_check passes them
-- by their owner, as check, and its releases need no expiry. A semaphore's
-- slots are attached as a name's lease is (a slot row is a lease row):
-- slot_acquire and slot_list read the session of an attached slot, and
-- slot_release needs no expiry. A Client writes its sessions
-- and attaches its leases with the statements under Sessions, below.
--
-- Time always comes from the server: UTC_TIMESTAMP(6) is fixed for the whole
-- statement and does not depend on the session time_zone.
--
-- The session guard. The pool is the application's, and three things may
-- change under a Client after its first use, on any of its connections at
-- any time, that would make a statement lie: a session timestamp (SET
-- timestamp = ..., or a DSN's timestamp=...) replaces UTC_TIMESTAMP(6), so a
-- live lease could be taken over or a lease written to end early; with
-- autocommit off (or, on MariaDB, an open transaction) a lease reported
-- taken is undone by the application's ROLLBACK; and a primary made
-- read-only (a demotion, its address moved to the new primary) still takes
-- writes from an account with SUPER on MariaDB, or READ ONLY ADMIN, so two
-- primaries would hand out one name. So every statement that takes or
-- extends a lease adds, once per row it writes, the terms
--   (18446744073709551615 + (@@autocommit = 0 ..) + (.. > 1000000)) * 0
--   + (9223372036854775807 + (.. @@global.read_only ..)) * 0
-- which are 0, or fail the statement with error 1690 (a value out of range,
-- as all_acquire's refusal; no sql_mode turns it into a warning), and the
-- server undoes it: nothing is written. The first term's first part is
-- autocommit off, or MariaDB's @@in_transaction; its second, NOW(6), the
-- session's clock at the statement's start, more than a second from
-- SYSDATE(6), the server's clock now, which no session timestamp moves
-- (unless the server runs with --sysdate-is-now). The second counts the
-- statement's own waits before the term (a table being altered; a row lock,
-- in an UPDATE), so a statement that waited past a second is refused too;
-- having written nothing, it is sent again at once, a few times
-- (internal/fault, Retry), and again by the loops that wait. The second
-- term is the server read-only now (read_only, which super_read_only sets
-- too). The terms hold no quote, so that the error's text, which quotes
-- the expression, shows all of it. The Go side knows the guard by the first number in the error's text (the
-- unsigned one: the session; the signed one: read-only, a refusal like the
-- server's own 1290), and which part of the first failed by the name
-- SYSDATE in it (MySQL does not print @@autocommit there). Lock.Check's
-- statements carry no guard: they run inside the application's transaction
-- by design.
-- Statement-based binary logging: the guard reads system variables and
-- SYSDATE, which are unsafe there, so binlog_format=MIXED logs these
-- statements as rows; with STATEMENT a replica runs the guard again, inside
-- the transaction its binary log opens, with its own clock and on a
-- read-only server. There every part but autocommit (which the binary log
-- carries from the primary) is skipped for the replica's applier, told apart
-- by USER(): a client's session is always user@host, with the host it
-- connected from ('localhost' over a socket), while the applier runs with no
-- account at all (MySQL, and MariaDB's parallel workers: ''; MariaDB's SQL
-- thread: '<replication_slave>@'): its last character is none, or @ (64). No SET
-- changes USER(), so no client session can pass itself off as the applier
-- (docs/servers.md).

-- Results are read from the OK packet's insert id, set with
-- LAST_INSERT_ID(expr): the table has no AUTO_INCREMENT column, so the id is
-- the last LAST_INSERT_ID(expr) the statement evaluated, or 0 if it evaluated
-- none. Within a statement, LAST_INSERT_ID() returns the last value set, which
-- carries a mark from the lease row to the fence row (not through Vitess,
-- whose vtgate puts its session's value in place of LAST_INSERT_ID(): there
-- the one-row forms below serve). Affected rows decide only where the DSN
-- flag clientFoundRows cannot change their meaning: a DELETE, an INSERT
-- without ON DUPLICATE KEY UPDATE, a row that changes.
--
-- Where a LAST_INSERT_ID(expr) sits in a branch that may not be taken, expr
-- refers to a column, so that no server can fold the call into a constant and
-- run it whether or not the branch is taken.

-- name: acquire
-- Args: name, token, holder, ttl µs, name; then token, holder, token, ttl µs.
-- Insert id: the fence when acquired, 0 when another owner's live lease
-- stands, 3 when the lease is attached (then acquire_attached decides).
--
-- The two rows are written in order, each under its row lock until commit:
-- 1. The lease row sets the mark: 1 when it is inserted (the VALUES part) or
--    taken over because it expired, 2 when it is already ours (a retry after
--    an unknown outcome), 0 when another owner's lease is live. Only the first
--    assignment reads the old row; the rest read the mark. So the row comes
--    out the same whether the server assigns left to right (MySQL, MariaDB's
--    default) or every assignment against the old row (MariaDB's
--    SIMULTANEOUS_ASSIGNMENT).
-- 2. The fence row, when the mark is 1, takes the greater of its old fence
--    plus one and the server's clock in microseconds. It is read under its
--    row lock, so fences follow the order in which acquisitions commit,
--    whatever the clock says; the clock only seeds a name's first fence and
--    keeps fences readable as times. When the mark is 2 it reports the fence
--    unchanged; when 0 it changes nothing, so a refused attempt writes nothing.
-- An attached lease (the top of this file), whoever's, sets the mark 3 and
-- nothing is written: the insert id is 3, and the Client sends
-- acquire_attached, which reads the session and decides; it sends that
-- alone for a name it found attached before, until it takes it
-- (internal/engine/attached.go). This statement
-- reads no session, so it opens the table once: a subquery on it, even
-- one never evaluated, costs every acquire a second open of the table
-- (docs/performance.md, holding many leases). The
-- fence row's update takes a new fence only when the mark is above 3 (the
-- clock its VALUES part set).
-- The expiry never moves earlier (GREATEST; the lease row taken was expired,
-- so there it is now + ttl): a send of the Lock's own acquire that runs late,
-- after the Lock's Refresh lengthened the lease, finds the lease ours and
-- must not end it before the Lock's ValidUntil (acquire.go, rule 3).
-- expires_at is assigned last and read only there, so both orders agree.
INSERT INTO `sqllock` (name, kind, owner, holder, fence, acquired_at, expires_at)
VALUES
  (?, 'L', ?, ?, LAST_INSERT_ID(1) * 0
     + (18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0,
   UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
  (?, 'F', '', '',
   IF(LAST_INSERT_ID() = 1, LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))), 0),
   UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
  -- Lease row: the mark (its fence column stays 0). Fence row: the fence.
  fence = IF(kind = 'L',
             LAST_INSERT_ID(IF(expires_at = '9999-12-31 23:59:59.999999', 3, IF(owner = ?, 2, IF(expires_at <= UTC_TIMESTAMP(6), 1, 0))) + fence) * 0,
             IF(LAST_INSERT_ID() = 2, LAST_INSERT_ID(fence),
                IF(LAST_INSERT_ID() > 3, LAST_INSERT_ID(GREATEST(fence + 1, LAST_INSERT_ID())), fence))),
  acquired_at = IF(kind = 'L' AND LAST_INSERT_ID() = 1, UTC_TIMESTAMP(6), acquired_at),
  holder = IF(kind = 'L' AND LAST_INSERT_ID() IN (1, 2), ?, holder),
  owner = IF(kind = 'L' AND LAST_INSERT_ID() = 1, ?, owner),
  expires_at = IF(kind = 'L' AND LAST_INSERT_ID() IN (1, 2), GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), expires_at);

-- name: acquire_attached
-- acquire, sent with the same arguments where acquire answered 3: the lease
-- row is attached, and this reads its session. Insert id as acquire's, never
-- 3. The rest of acquire's reasoning holds as it is written there.
--
-- A lease is live until its end (the top of this file), which for an
-- attached lease is its session's: the mark reads it, and a lease row taken
-- whose own expiry says 9999 gets now + ttl, not that.
-- The expiry of a lease that was ours and live never moves earlier
-- (GREATEST; a lease row taken had ended, so there it is now + ttl): a send
-- of the Lock's own acquire that runs late, after the Lock's Refresh
-- lengthened the lease, finds the lease ours and must not end it before the
-- Lock's ValidUntil (acquire.go, rule 3). expires_at is assigned last and
-- reads the mark and the owner only where the mark says the owner is
-- unchanged (2), so both orders agree.
INSERT INTO `sqllock` (name, kind, owner, holder, fence, acquired_at, expires_at)
VALUES
  (?, 'L', ?, ?, LAST_INSERT_ID(1) * 0
     + (18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0,
   UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
  (?, 'F', '', '',
   IF(LAST_INSERT_ID() = 1, LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))), 0),
   UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
  -- Lease row: the mark (its fence column stays 0). Fence row: the fence.
  fence = IF(kind = 'L',
             LAST_INSERT_ID(IF(owner = ?, 2, IF(IF(expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(`sqllock`.owner, 16) AND s.kind = 'S'), '1000-01-01'), expires_at) <= UTC_TIMESTAMP(6), 1, 0)) + fence) * 0,
             IF(LAST_INSERT_ID() = 2, LAST_INSERT_ID(fence),
                IF(LAST_INSERT_ID() > 2, LAST_INSERT_ID(GREATEST(fence + 1, LAST_INSERT_ID())), fence))),
  acquired_at = IF(kind = 'L' AND LAST_INSERT_ID() = 1, UTC_TIMESTAMP(6), acquired_at),
  holder = IF(kind = 'L' AND LAST_INSERT_ID() IN (1, 2), ?, holder),
  owner = IF(kind = 'L' AND LAST_INSERT_ID() = 1, ?, owner),
  expires_at = IF(kind = 'L' AND LAST_INSERT_ID() IN (1, 2),
                   GREATEST(IF(LAST_INSERT_ID() = 2 AND IF(expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(`sqllock`.owner, 16) AND s.kind = 'S'), '1000-01-01'), expires_at) > UTC_TIMESTAMP(6), expires_at, '1000-01-01'),
                            UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
                   expires_at);

-- The acquire's bound on waiting for the lease row, on MariaDB, which takes
-- a per-statement setting: put before the acquire. The row waits only behind
-- another transaction that wrote it: an acquire of the name committing
-- (milliseconds), or a holder's Lock.Check transaction, which keeps the row
-- locked until it ends. Past a second the acquire fails with 1205 and the
-- Client reports the name held, instead of waiting out
-- innodb_lock_wait_timeout (50 s by default). MySQL refuses this variable
-- in a SET_VAR hint (warning 3637), so there the caller's context bounds
-- the wait, and a 1205 is reported held too. TiDB's autocommit statements
-- run optimistically and do not wait.

-- name: lock_wait_mariadb
SET STATEMENT innodb_lock_wait_timeout = 1 FOR

-- name: refresh
-- Args: ttl µs, name, token. Insert id: 1 when extended, 0 when the lease is
-- not ours or has expired (LAST_INSERT_ID in SET is evaluated only for a row
-- that matches, changed or not; a lease row's fence is 0, so the column does
-- not change). The expiry becomes now + ttl or stays where it was, if that
-- is later: it never moves earlier (GREATEST, as in acquire), so a send of
-- the Lock's refresh that runs late, after a longer Refresh, cannot end the
-- lease before the Lock's ValidUntil.
-- The lease is live until its end (the top of this file): an attached
-- lease while its session lasts. Refreshed, an attached lease is detached:
-- its own expiry becomes the later of its session's end and now + ttl, so
-- it never ends earlier than it would have, and from then on it lasts by
-- that expiry alone. The session row is joined only for an attached lease,
-- and read, not written (an UPDATE may not read its own table in a
-- subquery on MySQL, 1093: hence the join). The lease row's lock orders
-- the refresh with a takeover, which writes that row too. The guard is the
-- IF's condition, so that it is tested before the lease's end, for the row
-- of name and token, whichever order the server tests the join's
-- conditions in (MariaDB tests the end first when they are apart).
UPDATE `sqllock` AS l
LEFT JOIN `sqllock` AS s ON l.expires_at = '9999-12-31 23:59:59.999999' AND s.name = LEFT(l.owner, 16) AND s.kind = 'S'
SET l.expires_at = GREATEST(IF(l.expires_at = '9999-12-31 23:59:59.999999', COALESCE(s.expires_at, '1000-01-01'), l.expires_at),
                            UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
    l.fence = LAST_INSERT_ID(l.fence + 1) * 0
WHERE l.name = ? AND l.kind = 'L' AND l.owner = ?
  AND IF((18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0 = 0,
         IF(l.expires_at = '9999-12-31 23:59:59.999999', COALESCE(s.expires_at, '1000-01-01'), l.expires_at),
         NULL) > UTC_TIMESTAMP(6);

-- name: release
-- Args: name, token. Affected rows: 1 when the row was ours, 0 when not (a
-- DELETE counts the same with or without clientFoundRows). An expired lease
-- that nobody took over is still ours to release. The fence row stays.
DELETE FROM `sqllock` WHERE name = ? AND kind = 'L' AND owner = ?;

-- name: force_release
-- Holes: name, token. ForceRelease's release of a live lease with no
-- lock-delay (WithLockDelay(0)), sent as text with literals: release, but
-- not of an attached lease, which ForceRelease ends through lock_delay, so
-- that its session counts the change (the top of this file). The lease it
-- read may have been attached since; then this deletes nothing, and
-- ForceRelease reads it again. Affected rows, as release's. The one-row
-- forms attach nothing: there ForceRelease sends release.
DELETE FROM `sqllock` WHERE name = ? AND kind = 'L' AND owner = ? AND expires_at <> '9999-12-31 23:59:59.999999';

-- name: inspect
-- Args: name. No row when the name was never taken; the lease columns are
-- NULL when it was released. The fifth column is how far the lease's
-- acquired_at lies ahead of this server's clock: negative (its age) unless
-- the lease was written on a node whose clock is ahead of this one's, which
-- the Client warns of (observe.go). The last says whether the lease is what a
-- release with a minimum hold left (release_at_least): its owner is then a
-- token's released form, 24 characters, which neither a token (32) nor a
-- lock-delay's owner (31, admin.go) is. Live and the lease left are by the
-- lease's end (the top of this file).
SELECT l.holder, f.fence, IF(l.expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(l.owner, 16) AND s.kind = 'S'), '1000-01-01'), l.expires_at) > UTC_TIMESTAMP(6),
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), IF(l.expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(l.owner, 16) AND s.kind = 'S'), '1000-01-01'), l.expires_at)),
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), l.acquired_at),
       LENGTH(l.owner) = 24
FROM `sqllock` AS f
LEFT JOIN `sqllock` AS l ON l.name = f.name AND l.kind = 'L'
WHERE f.name = ? AND f.kind = 'F';

-- name: first_use
-- No args: the Client puts its table's name (checked as every table name
-- is) in place of 'sqllock', so this is one plain query. Sent once per
-- Client, before its first statement, and read by internal/engine/tablecheck.go: one row
-- about the session and the server (autocommit: with it off, a DSN's
-- autocommit=0 or the server's default, no statement here would ever
-- commit; the version: TiDB takes its own forms; the database, in which
-- the Client names its table from then on, and which its later sends of
-- this query read in place of DATABASE()), then the table's engine,
-- columns and indexes as information_schema describes them, to hold against
-- schema.sql. Each part reads one view filtered by constant schema and
-- table names, which servers answer from the table's definition alone; no
-- joins. TABLE_NAME comes back so that Go can compare it exactly (the views
-- may compare names without regard to case).
SELECT 'server', @@SESSION.autocommit, VERSION(), @@lower_case_table_names, DATABASE(), NULL, NULL
UNION ALL
SELECT 'table', TABLE_NAME, ENGINE, NULL, NULL, NULL, NULL
FROM information_schema.TABLES
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'sqllock'
UNION ALL
SELECT 'column', TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLLATION_NAME, NULL
FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'sqllock'
UNION ALL
SELECT 'index', TABLE_NAME, INDEX_NAME, NON_UNIQUE, SEQ_IN_INDEX, COLUMN_NAME, SUB_PART
FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'sqllock';

-- name: carries
-- Args: 1. Sent after first_use, once per Client, before any statement is
-- prepared: whether LAST_INSERT_ID() reads back the value a
-- LAST_INSERT_ID(expr) set earlier in the same statement, which the two-row
-- acquire relies on. The first column sets the session's value with its
-- lowest bit flipped and the second reads it back: the same on MySQL and
-- MariaDB. TiDB reads the value from before the statement, and Vitess's
-- vtgate puts its own session's value in place of every LAST_INSERT_ID()
-- without an argument, so there the two differ and the Client takes the
-- one-row forms (internal/engine/tablecheck.go). The argument makes go-sql-driver prepare
-- it by default, which pins the connection under MySQL Router's connection
-- sharing: the router refuses LAST_INSERT_ID (3566) on a connection it
-- may move, and then the Client keeps the two-row forms.
SELECT LAST_INSERT_ID(LAST_INSERT_ID() XOR ?), LAST_INSERT_ID();

-- name: proof_clear
-- Args: a proof name. Deletes every row of the name, the fence too, which
-- no other statement does: a Client's first use proves the statements
-- under a name of its own (internal/engine/proof.go) and leaves nothing of it behind.
DELETE FROM `sqllock` WHERE name = ?;

-- name: server_mysql
-- No args. Sent by a Client's first use on each connection it holds then
-- (internal/engine/facts.go): whether the server refuses writes to accounts that
-- could still write (read_only lets an account with SUPER, or MariaDB's
-- READ ONLY ADMIN, write; super_read_only does not), and the server's
-- identity, and its Group Replication group's, which every member shares.
-- A server without the Group Replication plugin refuses the last variable
-- (1193): then server_mysql_plain is sent instead.
SELECT @@read_only, @@super_read_only, @@server_uuid, @@group_replication_group_name;

-- name: server_mysql_plain
-- No args. server_mysql for a server without Group Replication.
SELECT @@read_only, @@super_read_only, @@server_uuid, '';

-- name: server_mariadb
-- No args. server_mysql for MariaDB, which has no server_uuid: its
-- server_id with its host, port and data directory, which no two servers
-- share, and for a Galera node its cluster's state UUID, which every node
-- shares. MariaDB has no super_read_only: read_only refuses every account
-- but those with READ ONLY ADMIN.
SELECT @@read_only, 0, CONCAT_WS(' ', @@server_id, @@hostname, @@port, @@datadir),
       IF(@@wsrep_on, (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'WSREP_CLUSTER_STATE_UUID'), '');

-- name: proof_engine
-- Args: a proof name. Read by the first use's proof of the server's
-- semantics (internal/engine/semantics.go), after a takeover of the name's expired lease:
-- its owner, the lease's length as stored (acquired_at and expires_at, both
-- written from UTC_TIMESTAMP(6)), and a microsecond added to the clock,
-- which must come back as one microsecond: a server that drops the fraction
-- of a second when it adds an interval ends leases up to a second early.
SELECT owner, TIMESTAMPDIFF(MICROSECOND, acquired_at, expires_at),
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 MICROSECOND)
FROM `sqllock`
WHERE name = ? AND kind = 'L';

-- name: proof_overflow
-- Args: a proof name. Must fail with error 1690 (BIGINT UNSIGNED value is
-- out of range), which a set's acquire (all_acquire) relies on to refuse a
-- held name and undo the whole statement: then it writes nothing (an
-- engine that wraps instead writes the proof name's rows, which the proof
-- clears). An UPDATE, not a SELECT: MySQL Router with connection sharing
-- breaks the connection when a prepared SELECT's error comes after its
-- columns.
UPDATE `sqllock` SET fence = fence + 1 + 18446744073709551615 WHERE name = ?;

-- name: release_at_least
-- Args: min hold µs, name, token. Insert id: 1 when the lease was ours (not
-- 0 on TiDB, whose form sets the fence plus one), 0 when not (as in refresh). Release for Do's WithMinHold: instead of deleting
-- the lease, it sets the expiry to acquired_at plus the minimum hold. Later
-- than now, that keeps the name taken until then; in the past, it leaves an
-- expired lease, which blocks nobody, in the same round trip. Like release it
-- ignores expires_at: a lease that expired but that nobody took is still
-- ours, and nobody held the name in between. acquired_at is set only by an
-- acquire that took the name, so renewals do not move the minimum, and it is
-- not assigned here, so both assignment orders agree.
-- The lease it keeps is nobody's: its owner becomes the token's released
-- form, TO_BASE64(UNHEX(token)), 24 characters, which no token (32 hex
-- digits) equals. So no send of the Lock's acquire or refresh that runs
-- late prolongs it while it lasts (they find another owner's live lease),
-- and a DELETE by the token (an orphan's) leaves it. The statement matches
-- the token or its released form (LOWER(HEX(FROM_BASE64(..))) gives the
-- token back), read only from an owner of the released form's 24
-- characters: MariaDB's strict mode fails a statement that writes on
-- FROM_BASE64 of what is not base64 (1958), which a lock-delay's owner
-- (31 characters) is, and would fail the evicted holder's release. A send
-- of it repeated after a lost reply answers as the first, and leaves the released
-- form as it is (only a 32-byte owner is turned). Each assignment reads
-- only its own column or acquired_at, so both assignment orders agree.
UPDATE `sqllock`
SET expires_at = acquired_at + INTERVAL ? MICROSECOND,
    fence = LAST_INSERT_ID(fence + 1) * 0
      + (18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0,
    owner = IF(LENGTH(owner) = 32, TO_BASE64(UNHEX(owner)), owner)
WHERE name = ? AND kind = 'L' AND ? IN (owner, IF(LENGTH(owner) = 24, LOWER(HEX(FROM_BASE64(owner))), NULL));

-- name: check
-- Args: name, token. Sent inside the user's transaction by Lock.Check.
-- Affected rows: 1 when the lease is ours and live by the server's clock, 0
-- otherwise. It writes the lease row, so the row stays locked until the
-- transaction ends and no takeover commits before it (acquire, refresh and
-- release all write this row). The write is also what a multi-writer cluster
-- (Galera, Group Replication multi-primary) certifies at commit: a shared
-- lock is local to one node, a written row is in the transaction's write
-- set, so a takeover committed on another node makes the user's commit fail.
-- The write flips the lowest bit of acquired_at's microseconds, which no
-- decision reads (WithMinHold's release moves by 1 µs at most). A row that
-- changes counts as affected with and without clientFoundRows, so the answer
-- does not depend on the DSN. acquired_at is the only column assigned, so
-- both assignment orders agree. An attached lease passes while it is the
-- token's, whether or not its session lasts: reading the session row here
-- would hold it under a shared lock (REPEATABLE READ, SERIALIZABLE) for as
-- long as the user's transaction, and stall the renewal of every lease of
-- the session; the row's own lock and the token say as much, as nobody
-- takes a lease over without writing its row.
UPDATE `sqllock`
SET acquired_at = acquired_at + INTERVAL IF(MOD(MICROSECOND(acquired_at), 2) = 0, 1, -1) MICROSECOND
WHERE name = ? AND kind = 'L' AND owner = ? AND expires_at > UTC_TIMESTAMP(6);

-- name: list
-- No args. Every live lease, in name order, with its name's fence (0 if the
-- fence row was deleted by hand), the lease left by the server's clock, and
-- how far its acquired_at lies ahead of that clock (as in inspect).
-- A semaphore's slot (its name ends with 0x00 'slot' and two digits, which
-- no lock name may: see the semaphore statements below) has the
-- semaphore's fence, in the fence row named without the two digits.
-- It reads the whole table: kind is the second column of the primary key.
SELECT l.name, l.holder, COALESCE(f.fence, 0),
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), IF(l.expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(l.owner, 16) AND s.kind = 'S'), '1000-01-01'), l.expires_at)),
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), l.acquired_at)
FROM `sqllock` AS l
LEFT JOIN `sqllock` AS f
  ON f.name = IF(SUBSTRING(l.name, -7, 5) = X'00736C6F74' AND SUBSTRING(l.name, -2, 1) BETWEEN '0' AND '9' AND SUBSTRING(l.name, -1) BETWEEN '0' AND '9',
                 LEFT(l.name, LENGTH(l.name) - 2), l.name)
 AND f.kind = 'F'
WHERE l.kind = 'L' AND IF(l.expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(l.owner, 16) AND s.kind = 'S'), '1000-01-01'), l.expires_at) > UTC_TIMESTAMP(6)
ORDER BY l.name;

-- name: once_done
-- Args: name. A row when the name has Once's completion record ('D').
SELECT 1 FROM `sqllock` WHERE name = ? AND kind = 'D';

-- name: once_record
-- Args: name, token. Insert id: the lease row's fence plus one when the
-- completion record was written (1: a lease row's fence is 0, except on TiDB),
-- 0 when the lease is not ours, and then nothing is written. Affected rows
-- say the same (1 or 0), and decide through Vitess: in a sharded keyspace
-- vtgate runs this as the SELECT ... FOR UPDATE and an INSERT of its values,
-- in one transaction on the name's shard, and hands back no insert id. The record is
-- copied from our lease row, so no record is written for a runner whose
-- lease someone took over: that someone runs fn again. FOR UPDATE makes the
-- read of the lease row a locking read at every isolation level (under READ
-- COMMITTED a plain read in INSERT ... SELECT takes no lock), so the row is
-- read as committed and stays ours until the record commits: a takeover
-- waits for it. A duplicate key (1062) means the record is there already,
-- written by an earlier attempt whose reply was lost: the SELECT found our
-- lease row, or there would have been nothing to insert. No ON DUPLICATE KEY
-- UPDATE: with it, INSERT ... SELECT is unsafe for statement-based
-- replication (Note 1592); without it, it is safe.
INSERT INTO `sqllock` (name, kind, owner, holder, fence, acquired_at, expires_at)
SELECT l.name, 'D', l.owner, l.holder, LAST_INSERT_ID(l.fence + 1) * 0,
       UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
FROM `sqllock` AS l
WHERE l.name = ? AND l.kind = 'L' AND l.owner = ?
FOR UPDATE;

-- name: lease
-- Args: name. The lease row whoever holds it, live or expired, with its
-- owner token and its name's fence: what Client.ForceRelease deletes (by
-- that token, through release) or puts under a lock-delay (lock_delay), so
-- a takeover between the two is never touched. A semaphore's slot has the
-- semaphore's fence, as in list. Live and the lease left are by the lease's
-- end; the last column says whether it is attached, which ForceRelease ends
-- through lock_delay even with no delay, so that its session counts it.
SELECT l.owner, l.holder, COALESCE(f.fence, 0), IF(l.expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(l.owner, 16) AND s.kind = 'S'), '1000-01-01'), l.expires_at) > UTC_TIMESTAMP(6),
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), IF(l.expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(l.owner, 16) AND s.kind = 'S'), '1000-01-01'), l.expires_at)),
       l.expires_at = '9999-12-31 23:59:59.999999'
FROM `sqllock` AS l
LEFT JOIN `sqllock` AS f
  ON f.name = IF(SUBSTRING(l.name, -7, 5) = X'00736C6F74' AND SUBSTRING(l.name, -2, 1) BETWEEN '0' AND '9' AND SUBSTRING(l.name, -1) BETWEEN '0' AND '9',
                 LEFT(l.name, LENGTH(l.name) - 2), l.name)
 AND f.kind = 'F'
WHERE l.name = ? AND l.kind = 'L';

-- name: lock_delay
-- Args: the delay in µs, or NULL for the default; owner, holder, name,
-- token. Client.ForceRelease's lock-delay (admin.go): the lease row of
-- token, live, passes to an owner nobody holds (the Client makes it: no
-- token, nor a token's released form, equals it) and a holder that says
-- what it is, until the server's now plus the delay. Every acquire finds
-- the name held until then and takes it over as an expired lease after; the
-- fence row is untouched, so the next holder's fence is still higher than
-- the evicted one's. The evicted holder's next renewal finds the lease not
-- its own and stops its work. Affected rows: 1 when the lease was token's
-- (the owner changes, so the row counts with and without clientFoundRows),
-- 2 when it was also attached: its session row (joined only then) counts
-- one more change by others in its fence, which tells the holder's Client
-- to look for the lease it lost; 0 when someone took it over or it was
-- released. Insert id: the delay in µs (0 when it is 0).
--
-- The default delay lasts until the evicted holder's next renewal has seen
-- the loss and its work has had its safety margin to stop: R/3 + min(R/5,
-- 6 s), R being what the lease had left, by the server's clock, at the
-- moment of the update, to its end (an attached lease's is its session's;
-- admin.go, defaultLockDelay, says why). The lease's expires_at alone reads
-- the old row (owner and holder are arguments; the join is made before any
-- row is written), so both assignment orders agree. It takes the name from everyone, as an acquire
-- does, so it carries the session guard.
UPDATE `sqllock` AS l
LEFT JOIN `sqllock` AS s ON l.expires_at = '9999-12-31 23:59:59.999999' AND s.name = LEFT(l.owner, 16) AND s.kind = 'S'
SET l.expires_at = UTC_TIMESTAMP(6) + INTERVAL LAST_INSERT_ID(
      COALESCE(?, GREATEST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), IF(l.expires_at = '9999-12-31 23:59:59.999999', COALESCE(s.expires_at, '1000-01-01'), l.expires_at)), 0) DIV 3
                  + LEAST(GREATEST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), IF(l.expires_at = '9999-12-31 23:59:59.999999', COALESCE(s.expires_at, '1000-01-01'), l.expires_at)), 0) DIV 5, 6000000))
      + (18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0) MICROSECOND,
    l.owner = ?, l.holder = ?, s.fence = s.fence + 1
WHERE l.name = ? AND l.kind = 'L' AND l.owner = ?;

-- name: once_reset
-- Args: name. Affected rows: 1 when Once's completion record was deleted, so
-- that the next Once runs its function again; 0 when there was none.
DELETE FROM `sqllock` WHERE name = ? AND kind = 'D';

-- name: wake_wait
-- Args: the lease name as a hex literal (X'...'), twice, then the timeout in
-- whole seconds. The wake-up channel of a name (internal/wait/channel.go): a server named lock
-- beside the lease, held by the process that waited for the lease and took
-- it, on which processes waiting for the name block instead of polling. It
-- is advice only: no decision reads it; the lease row decides.
-- It runs as text on the channel's own connection, never prepared, so the
-- Go side puts literals in place of the placeholders (values it made: hex
-- digits and a number) and the table's name, as first_use does, in place of
-- 'sqllock'. The lock's name hashes the database, the table and the lease
-- name, so two tables never share a channel and any name fits GET_LOCK's 64
-- characters. One row: whether the channel was free just before (1: nobody
-- held it, so this process did not queue behind anyone), and GET_LOCK's
-- answer (1 granted, 0 timed out). Servers grant GET_LOCK's waiters in the
-- order they came.
SELECT IS_FREE_LOCK(CONCAT('sqllock:', LEFT(SHA2(CONCAT_WS(0x00, DATABASE(), 'sqllock', ?), 256), 56))),
       GET_LOCK(CONCAT('sqllock:', LEFT(SHA2(CONCAT_WS(0x00, DATABASE(), 'sqllock', ?), 256), 56)), ?);

-- name: wake_release
-- Args: the lease name as a hex literal. Sent as wake_wait is, on the
-- channel's connection, after the lease's release: it wakes the first
-- process waiting in wake_wait. 1 when the channel was held here.
SELECT RELEASE_LOCK(CONCAT('sqllock:', LEFT(SHA2(CONCAT_WS(0x00, DATABASE(), 'sqllock', ?), 256), 56)));

-- name: wake_probe
-- Args: the lease name as a hex literal. Sent as wake_wait is, on any
-- connection, after the release of a Lock whose Acquire did not wait: the
-- id of the connection that holds the channel, or NULL. Another process
-- holds it only while it waits for the name, so this Client's next Acquire
-- of the name queues behind it.
SELECT IS_USED_LOCK(CONCAT('sqllock:', LEFT(SHA2(CONCAT_WS(0x00, DATABASE(), 'sqllock', ?), 256), 56)));

-- name: look
-- Args: the names as hex literals, at most 64, which the Go side puts in
-- place of the one placeholder, separated by commas. The names whose lease
-- is live by the server's clock. A Client's waiting Acquire calls ask it for
-- every name due at one time (internal/wait/look.go) instead of sending each its acquire,
-- and send the acquire only for a name not listed, which decides: this
-- reads, writes nothing and takes no lock, and a stale answer only delays or
-- wastes one acquire. owner <> '' serves TiDB's one-row form too, where a
-- released name keeps its row with an empty owner; a lease row of the
-- two-row form always has an owner. Sent as text, never prepared, as
-- wake_wait is: the list's length varies.
SELECT name FROM `sqllock`
WHERE kind = 'L' AND owner <> '' AND IF(expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(`sqllock`.owner, 16) AND s.kind = 'S'), '1000-01-01'), expires_at) > UTC_TIMESTAMP(6) AND name IN (?);

-- name: tidb_look
-- look on the one-row forms (TiDB, Vitess), which read no session: their
-- Clients attach no lease, and through Vitess's sharded keyspace vtgate
-- refuses look's session read (VT12001: a subquery inside an expression).
-- An attached lease, which a Client on the two-row forms may write to the
-- same table, reads as live here, as in every one-row form.
SELECT name FROM `sqllock`
WHERE kind = 'L' AND owner <> '' AND expires_at > UTC_TIMESTAMP(6) AND name IN (?);

-- Sets: a Lock on several names (acquire_set.go), taken all or nothing.
-- The statements are sent as text, never prepared: the number of names
-- varies. The Go side puts literals in place of the placeholders, in order
-- (hex literals for names, tokens and holders, decimal numbers), and the
-- table's name in place of `sqllock`. The rows of a set are written in the
-- byte order of its names. Every lease row of a set is an ordinary lease
-- row under the set's one token, so the single-name statements (release,
-- lease, list, inspect) see each name of a set as a lease of its own.

-- name: all_acquire
-- Holes: the rows (below), then token, holder, ttl µs, token. Insert id:
-- 2F + 1, where F is the fence every name of the set now has.
--
-- All or nothing: a lease row held live by another owner makes the
-- statement fail with error 1690 (an unsigned value out of range, which no
-- sql_mode turns into a warning), and the server rolls the whole statement
-- back, so a refused set writes nothing. The expression reads a column, so
-- no server evaluates it unless its branch is taken.
--
-- The rows, in this order, each under its row lock until commit:
-- 1. Every lease row (all_acquire_lease), in name order: taken when absent,
--    expired, or ours (a retry after an unknown outcome). A set takes its
--    lease rows before any fence row, as a single acquire does, so two
--    statements that share a name, sets or single acquires, wait for each
--    other at their first shared lease row and never hold a row the other
--    waits for: no deadlock.
-- 2. Every fence row, first pass: LAST_INSERT_ID carries 2M, where M is
--    the greatest of the clock in microseconds and each old fence plus one.
--    The first row (all_acquire_fence_first) starts it from the clock; a
--    new fence row is inserted with the running value, which the second
--    pass overwrites. Fences are left as they are.
-- 3. Every fence row again (all_acquire_fence_write): each row's values
--    first set the lowest bit, and the update then writes M into the fence.
--    Every name of the set gets the same fence M, greater than each of its
--    old fences. 2M must fit in 64 bits: a fence past 2^63 (only a change by
--    hand makes one) fails the statement with 1690, as a held name does.
-- The ODKU part is shared by all rows: kind tells a lease row from a fence
-- row, and the lowest bit of LAST_INSERT_ID() the first pass from the
-- second. Only the fence assignment reads the old row (besides kind, which
-- no assignment changes, and expires_at, read with owner by its own
-- assignment, which comes before owner's), so both assignment orders
-- agree. A lease is live until its end, read as in acquire. A lease row's
-- expiry never moves earlier, as in acquire: a row taken had ended, and
-- gets now + ttl; a row that was ours and live keeps a later expiry a
-- Refresh of the set gave it.
INSERT INTO `sqllock` (name, kind, owner, holder, fence, acquired_at, expires_at)
VALUES ?
ON DUPLICATE KEY UPDATE
  fence = IF(kind = 'L',
             IF(owner = ? OR IF(expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(`sqllock`.owner, 16) AND s.kind = 'S'), '1000-01-01'), expires_at) <= UTC_TIMESTAMP(6), fence, fence + 1 + 18446744073709551615),
             IF(LAST_INSERT_ID() & 1 = 0,
                LAST_INSERT_ID(GREATEST(fence + 1, LAST_INSERT_ID() DIV 2) * 2) * 0 + fence,
                LAST_INSERT_ID() DIV 2)),
  acquired_at = IF(kind = 'L', UTC_TIMESTAMP(6), acquired_at),
  holder = IF(kind = 'L', ?, holder),
  expires_at = IF(kind = 'L',
                  GREATEST(IF(IF(expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(`sqllock`.owner, 16) AND s.kind = 'S'), '1000-01-01'), expires_at) > UTC_TIMESTAMP(6), expires_at, '1000-01-01'),
                           UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
                  expires_at),
  owner = IF(kind = 'L', ?, owner);

-- name: all_acquire_lease
-- A lease row of all_acquire. Holes: name, token, holder, ttl µs.
(?, 'L', ?, ?, 0
   + (18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0,
 UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND);

-- name: all_acquire_fence_first
-- The first fence row of all_acquire's first pass. Holes: name.
(?, 'F', '', '', LAST_INSERT_ID(2 * TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))) DIV 2,
 UTC_TIMESTAMP(6), UTC_TIMESTAMP(6));

-- name: all_acquire_fence
-- Every other fence row of all_acquire's first pass. Holes: name.
(?, 'F', '', '', LAST_INSERT_ID() DIV 2, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6));

-- name: all_acquire_fence_write
-- A fence row of all_acquire's second pass. Holes: name.
(?, 'F', '', '', LAST_INSERT_ID(LAST_INSERT_ID() | 1) * 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6));

-- name: all_refresh
-- Holes: the names, then ttl µs, token. Affected rows: how many of the set's
-- leases are extended; the write also flips the lowest bit of acquired_at's
-- microseconds (as check does), so every row it matches changes, and counts
-- with and without clientFoundRows. All or nothing: a lease row of the set
-- that is not ours, has expired, or is gone (deleted by a forced release,
-- and not taken since) makes the statement fail with error 1690 (as
-- all_acquire's refusal), and the server undoes it, so a refused refresh
-- extends none of the others. The names come as a derived table, w, joined
-- to their lease rows: a missing lease row comes as NULLs, the IF takes its
-- second branch and the sum overflows. The names are Client-sent literals
-- joined by " UNION ALL SELECT ", after a first row of NULL: a UNION is
-- always materialized, never merged into the UPDATE, so no server takes a
-- name for a constant and folds the overflow before the IF is decided (a
-- derived table of one SELECT is merged, and then fails every refresh);
-- the NULL row makes the IF NULL, so it matches nothing and raises
-- nothing. The IF as a whole is not NULL when a name's lease row is
-- missing, so no server turns the LEFT JOIN into an inner join, which would
-- skip the missing row. The statement locks only the set's lease rows, one
-- by one in the names' order (w is read first, in the order it was
-- written), as all_acquire takes them: it never locks a fence row, so it
-- waits for an acquire of a shared name at their first shared lease row
-- and never deadlocks with it. The test is in WHERE, after the session
-- guard (whose failure is told apart by its text), before SET. The expiry
-- never moves earlier, as in refresh. A lease of the set that is attached
-- lives while its session does, and is detached, as refresh reads and
-- detaches one: the session row is joined only for an attached lease, and
-- read, not written; it adds no NULL that would turn the IF NULL (COALESCE).
UPDATE (SELECT NULL AS name UNION ALL SELECT ?) AS w
LEFT JOIN `sqllock` AS l ON l.name = w.name AND l.kind = 'L'
LEFT JOIN `sqllock` AS s ON l.expires_at = '9999-12-31 23:59:59.999999' AND s.name = LEFT(l.owner, 16) AND s.kind = 'S'
SET l.expires_at = GREATEST(IF(l.expires_at = '9999-12-31 23:59:59.999999', COALESCE(s.expires_at, '1000-01-01'), l.expires_at),
                            UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
    l.acquired_at = l.acquired_at + INTERVAL IF(MOD(MICROSECOND(l.acquired_at), 2) = 0, 1, -1) MICROSECOND
WHERE (18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0 = 0
  AND IF(l.owner = ? AND IF(l.expires_at = '9999-12-31 23:59:59.999999', COALESCE(s.expires_at, '1000-01-01'), l.expires_at) > UTC_TIMESTAMP(6), 0, LENGTH(w.name) + 18446744073709551615) = 0;

-- name: renew_many
-- Holes: ttl µs; the names of the lease rows; then each lease's owner and
-- name, concatenated (owner first: a token is 32 bytes, so a pair reads one
-- way only). The Client's shared renewal (renewal.go): the leases its
-- keep-alives hold for one ttl, each extended as refresh extends one, in
-- one statement of up to a few thousand: names, sets and semaphores' slots
-- alike, as they are all lease rows. A row is extended only while it is
-- that owner's and live, as in refresh, and the expiry never moves
-- earlier: so a send that runs late, or again, cannot revive a released or
-- lapsed lease, extend a lease another owner holds now, or shorten one.
-- Affected rows: how many were extended; the write also flips the lowest
-- bit of acquired_at's microseconds (as all_refresh), so that every row
-- matched changes and counts with and without clientFoundRows. A name
-- appears once in a statement and a pair matches its one row, so the count
-- equals the number of pairs only when every lease was extended; when it
-- is short, the Go side has each lease of the statement renewed on its own
-- (refresh), which tells which was lost. The IN list on both columns of the
-- primary key reads each row by its key (range access, record locks only,
-- in the key's order, as all_acquire and all_check take them), never the
-- whole table, which under REPEATABLE READ would lock every row: FORCE
-- INDEX keeps the optimizer from a scan it costs lower when the list is a
-- good part of the table; and past what the range optimizer plans by
-- default (MySQL: range_optimizer_max_mem_size, about 15,000 names;
-- MariaDB: optimizer_max_sel_arg_weight, 16,000), MySQL 8.0 and later take
-- the second hint and MariaDB 10.5.9 and later the prefix
-- renew_many_mariadb, each for this statement alone. The Go side keeps a
-- statement to 34,000 names and 8 MiB on those, and to 4,096 names and
-- 1 MiB elsewhere (engine.RenewLimits). One form for every server: it
-- writes no fence, so TiDB's and Vitess's one-row forms take it as it is
-- (each hint stays on its own server alone). An attached lease (the top of
-- this file) is not extended: its session keeps it, and the Client refreshes
-- one it carried on its own, which reads the session.
UPDATE /*+ SET_VAR(tidb_retry_limit=0) */ /*+ SET_VAR(range_optimizer_max_mem_size=0) */ `sqllock` FORCE INDEX (PRIMARY)
SET expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
    acquired_at = acquired_at + INTERVAL IF(MOD(MICROSECOND(acquired_at), 2) = 0, 1, -1) MICROSECOND
WHERE kind = 'L' AND name IN (?)
  AND (18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0 = 0
  AND CONCAT(owner, name) IN (?)
  AND expires_at > UTC_TIMESTAMP(6) AND expires_at <> '9999-12-31 23:59:59.999999';

-- name: renew_many_mariadb
-- The prefix of renew_many and renew_found on MariaDB 10.5.9 and later: no
-- bound on the range optimizer's graph for this statement, and no IN list
-- turned into a derived table (which MariaDB joins to a scan of the whole
-- table: in_predicate_conversion_threshold, 1,000 names by default), so
-- that an IN list of tens of thousands of names is still read by key.
SET STATEMENT optimizer_max_sel_arg_weight = 0, in_predicate_conversion_threshold = 0 FOR

-- name: renew_found
-- Holes: the names; then the owner-and-name pairs, as renew_many's. Which
-- of the pairs are their owner's and live now, each as its owner and name
-- concatenated: sent after a renew_many that extended fewer leases than
-- it carried, to tell which it extended (renewal.go). A plain SELECT in
-- autocommit, a consistent read: it takes no lock and waits for none. A
-- pair found was extended by that renew_many, sent before it: it was its
-- owner's and live when that statement ran, as a lease that lapsed, was
-- released or was taken over never comes back but by its own owner's
-- acquire, which sets an expiry at least as late. An attached lease, which
-- renew_many does not extend, is not found. It reads the rows by key,
-- as renew_many does, with the same hint and prefix.
SELECT /*+ SET_VAR(range_optimizer_max_mem_size=0) */ CONCAT(owner, name)
FROM `sqllock` FORCE INDEX (PRIMARY)
WHERE kind = 'L' AND name IN (?) AND CONCAT(owner, name) IN (?)
  AND expires_at > UTC_TIMESTAMP(6) AND expires_at <> '9999-12-31 23:59:59.999999';

-- Sessions: one statement keeps many leases alive (the top of this file).
-- A Client keeps a session for the keep-alives of one ttl (renewal.go,
-- session.go): each round renews the session, and attaches the leases
-- that renew_many extended and that are the session's (their owner begins
-- with its name). Sent as text, with literals in place of the holes (hex
-- for the session's name, numbers for µs), each one round trip. Only the
-- two-row forms: TiDB's and Vitess's Clients keep no session.

-- name: session_open
-- Holes: session, session, holder, ttl µs. The session's row, live for ttl,
-- its count of changes 0. A plain INSERT: the session's name is 16 random
-- hex digits, drawn anew for each session, so it is never there already
-- (1062 if it were, and nothing is written). It carries the session guard,
-- as every statement that extends leases.
INSERT INTO `sqllock` (name, kind, owner, holder, fence, acquired_at, expires_at)
VALUES (?, 'S', ?, ?, 0 + (18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0,
        UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND);

-- name: session_renew
-- Holes: ttl µs, session, session. Insert id: the session's count of
-- changes by others plus one when it was renewed, 0 when it has ended or
-- is gone (LAST_INSERT_ID in SET is evaluated only for a row that
-- matches). Renewed, its end becomes now + ttl or stays, if later (never
-- earlier, as refresh). Whether it has ended is judged by the server's
-- clock when the row is read, not when the statement began (NOW(6) is the
-- statement's start, SYSDATE(6) the clock now, so their difference moves
-- UTC_TIMESTAMP(6) on to now): a renewal that waited for the session's row
-- while the session ended must not revive it, for an acquire may have
-- taken one of its leases in the meantime; it writes the lease's row, not
-- the session's, so nothing else orders the two. The guard is the IF's
-- condition, tested before the end, as in refresh.
UPDATE `sqllock`
SET expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
    fence = LAST_INSERT_ID(fence + 1) * 0 + fence
WHERE name = ? AND kind = 'S' AND owner = ?
  AND IF((18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0 = 0, expires_at, NULL) > UTC_TIMESTAMP(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6)) MICROSECOND;

-- name: session_attach
-- Holes: session, session; the names of the lease rows; then each lease's
-- owner and name, concatenated, as renew_many's. Attaches each listed lease
-- that is its owner's, live, not attached, and ends no later than the
-- session (whose end is read by the clock now, as in session_renew): so an
-- attach never shortens a lease, and never ties one to a session that has
-- ended. Affected rows: how many it attached (the row changes, so it counts
-- with and without clientFoundRows). The session's row is read by its key,
-- once; the lease rows by key, as renew_many reads them, with the same
-- hint and prefix.
UPDATE /*+ SET_VAR(range_optimizer_max_mem_size=0) */ `sqllock` AS l FORCE INDEX (PRIMARY)
JOIN `sqllock` AS s ON s.name = ? AND s.kind = 'S' AND s.owner = ?
SET l.expires_at = '9999-12-31 23:59:59.999999'
WHERE l.kind = 'L' AND l.name IN (?)
  AND (18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0 = 0
  AND CONCAT(l.owner, l.name) IN (?)
  AND l.expires_at > UTC_TIMESTAMP(6) AND l.expires_at < '9999-12-31 23:59:59.999999'
  AND s.expires_at >= l.expires_at AND s.expires_at > UTC_TIMESTAMP(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6)) MICROSECOND;

-- name: session_found
-- Holes: the names; the pairs, as renew_many's. Which of the pairs are
-- their owner's and attached, each as its owner and name concatenated:
-- sent after a session_attach that attached fewer than it carried, and
-- after a session_renew whose count of changes moved (lock_delay), to tell
-- which. A consistent read, as renew_found.
SELECT /*+ SET_VAR(range_optimizer_max_mem_size=0) */ CONCAT(owner, name)
FROM `sqllock` FORCE INDEX (PRIMARY)
WHERE kind = 'L' AND name IN (?) AND CONCAT(owner, name) IN (?)
  AND expires_at = '9999-12-31 23:59:59.999999';

-- name: session_detach
-- Holes: the names; the pairs, as renew_many's. Detaches each listed lease
-- that is its owner's and attached, to its session's end as it stands: it
-- lasts as long as it would have had its session not been renewed again,
-- no longer and no shorter. Sent for the leases of keep-alives that ended
-- lost while their Locks were not released (a renewal that came too late,
-- a set of which another name was taken): attached, such a lease would
-- last as long as its session, which the Client renews for its other
-- leases, with no holder. A lease whose session is gone is not matched: it
-- has ended. It extends nothing, so it carries no guard; a send that runs
-- late finds the lease its owner's and attached only while it is both, and
-- its pairs name tokens no later lease has.
UPDATE /*+ SET_VAR(range_optimizer_max_mem_size=0) */ `sqllock` AS l FORCE INDEX (PRIMARY)
JOIN `sqllock` AS s ON s.name = LEFT(l.owner, 16) AND s.kind = 'S'
SET l.expires_at = s.expires_at
WHERE l.kind = 'L' AND l.name IN (?) AND CONCAT(l.owner, l.name) IN (?)
  AND l.expires_at = '9999-12-31 23:59:59.999999';

-- name: session_close
-- Holes: session, session, all (1 or 0). Deletes the session's row once
-- its Client's keep-alives of that ttl have all ended: with all 0, only if
-- the session has ended by the server's clock, for its end is that of
-- every lease still attached to it (one lost and not detached, one whose
-- release failed), whose holder was given a ValidUntil up to it; with 1
-- (Client.Close, which releases every lease, and the proof), at once.
DELETE FROM `sqllock` WHERE name = ? AND kind = 'S' AND owner = ? AND (? OR expires_at <= UTC_TIMESTAMP(6));

-- name: all_release
-- Holes: token, the names. Affected rows: how many of the set's leases were
-- still ours (a DELETE counts the same with or without clientFoundRows).
DELETE FROM `sqllock` WHERE kind = 'L' AND owner = ? AND name IN (?);

-- name: all_release_at_least
-- Holes: min hold µs, token, the names. As release_at_least, for a set; the
-- flip of acquired_at (as all_refresh) makes the affected rows count every
-- lease that was ours. expires_at is assigned first, from the old
-- acquired_at, in both assignment orders. The owner becomes the token's
-- released form, and a repeat matches it, as in release_at_least.
UPDATE /*+ SET_VAR(tidb_retry_limit=0) */ `sqllock`
SET expires_at = acquired_at + INTERVAL ? MICROSECOND,
    acquired_at = acquired_at + INTERVAL IF(MOD(MICROSECOND(acquired_at), 2) = 0, 1, -1) MICROSECOND
      + INTERVAL 0 + (18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0 MICROSECOND,
    owner = IF(LENGTH(owner) = 32, TO_BASE64(UNHEX(owner)), owner)
WHERE kind = 'L' AND ? IN (owner, IF(LENGTH(owner) = 24, LOWER(HEX(FROM_BASE64(owner))), NULL)) AND name IN (?);

-- name: all_check
-- Holes: token, the names. As check, for a set, inside the user's
-- transaction: affected rows count the set's leases that are ours and live,
-- each now locked until the transaction ends. An attached lease passes
-- while it is the token's, as in check.
UPDATE `sqllock`
SET acquired_at = acquired_at + INTERVAL IF(MOD(MICROSECOND(acquired_at), 2) = 0, 1, -1) MICROSECOND
WHERE kind = 'L' AND owner = ? AND expires_at > UTC_TIMESTAMP(6) AND name IN (?);

-- name: all_fences
-- Holes: token, the names. The fence of every lease row of the set that is
-- ours: read after tidb_all_acquire, whose insert id cannot carry them.
SELECT name, fence FROM `sqllock` WHERE kind = 'L' AND owner = ? AND name IN (?);

-- TiDB. Its LAST_INSERT_ID() returns the value from before the statement, so
-- no mark set on one row reaches another, and a LAST_INSERT_ID(expr) whose
-- argument is fixed for the statement takes effect even in a branch not
-- taken; one whose argument reads a column is evaluated per row, as on MySQL
-- (MYSQL-FACTS.md). On TiDB a name therefore has one row, its lease row
-- ('L'), which carries the fence and is never deleted: release empties the
-- owner instead. Every statement reads and writes that row only, and reads
-- an insert id set from a column. The statements below take the place of
-- those of the same name without the prefix when a Client's first use finds
-- TiDB (internal/engine/tablecheck.go); the others serve TiDB as they are. Through Vitess,
-- whose vtgate puts its session's value in place of LAST_INSERT_ID() (so a
-- mark cannot pass between rows there either), a Client takes them without
-- the SET_VAR hint, all but tidb_once_record: once_record serves there. A
-- table is used by one kind of server: rows the two-row statements left
-- ('F') are not read here.
--
-- TiDB runs an autocommit statement optimistically and, on a write conflict
-- at commit, runs it again itself, up to tidb_retry_limit times (10 by
-- default), answering with the insert id of the first run: an acquire that
-- took a free name, lost the race at commit and found the name taken when
-- run again would be told it had the lease. Every statement here that writes
-- sets tidb_retry_limit to 0 for itself (SET_VAR), so a conflict comes back
-- as error 9007, which the Client sends again like any rolled-back
-- statement, and the answer is that of the run that committed.

-- name: tidb_acquire
-- Args: name, token, holder, ttl µs. Insert id: the fence when acquired, 0
-- when another owner's live lease stands.
-- A new name's row is inserted with the server's clock in microseconds as
-- its first fence. Otherwise the row is there (a release keeps it), and the
-- fence is written under the row's lock, so fences follow the order in which
-- acquisitions commit: one more than the last when the lease is free
-- (released, owner '', or expired) and not ours, the same when it is ours (a
-- retry after an unknown outcome), and 0 given to LAST_INSERT_ID when
-- another owner's lease is live, which GREATEST keeps from the column. The
-- argument reads columns, so TiDB evaluates it for this row. Assignments run
-- left to right and each sees the ones before: all but the last read only
-- columns not yet assigned, and expires_at, last, reads the new owner, which
-- is ours exactly when the lease was taken or was ours, and the old expiry:
-- never moved earlier, as in acquire (a lease taken had expired, or was
-- released, which sets the expiry to then). VALUES() is the row the INSERT
-- would have written, so the arguments are given once.
INSERT /*+ SET_VAR(tidb_retry_limit=0) */ INTO `sqllock` (name, kind, owner, holder, fence, acquired_at, expires_at)
VALUES (?, 'L', ?, ?, LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))
          + (18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0,
        UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE
  fence = GREATEST(fence, LAST_INSERT_ID(
            IF(owner = VALUES(owner), fence,
               IF(owner = '' OR expires_at <= UTC_TIMESTAMP(6), fence + 1, 0)))),
  acquired_at = IF(owner <> VALUES(owner) AND (owner = '' OR expires_at <= UTC_TIMESTAMP(6)),
                   UTC_TIMESTAMP(6), acquired_at),
  holder = IF(owner = VALUES(owner) OR owner = '' OR expires_at <= UTC_TIMESTAMP(6), VALUES(holder), holder),
  owner = IF(owner = '' OR expires_at <= UTC_TIMESTAMP(6), VALUES(owner), owner),
  expires_at = IF(owner = VALUES(owner), GREATEST(expires_at, VALUES(expires_at)), expires_at);

-- name: tidb_refresh
-- Args: ttl µs, name, token. As refresh (the expiry never moves earlier),
-- with the fence kept: the insert id is the fence plus one, never 0, and the
-- column is written back unchanged (plus the call times 0:
-- LAST_INSERT_ID(fence + 1) - 1 is signed under NO_UNSIGNED_SUBTRACTION,
-- error 1690 for a fence past 2^63).
UPDATE /*+ SET_VAR(tidb_retry_limit=0) */ `sqllock`
SET expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
    fence = fence + LAST_INSERT_ID(fence + 1) * 0
WHERE name = ? AND kind = 'L' AND owner = ?
  AND (18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0 = 0
  AND expires_at > UTC_TIMESTAMP(6);

-- name: tidb_release
-- Args: name, token. Affected rows: 1 when the lease was ours (the owner
-- changes, so the row counts with and without clientFoundRows), 0 when not.
-- The row and its fence stay; an empty owner marks the name free.
UPDATE /*+ SET_VAR(tidb_retry_limit=0) */ `sqllock`
SET owner = '', holder = '', expires_at = UTC_TIMESTAMP(6)
WHERE name = ? AND kind = 'L' AND owner = ?;

-- name: tidb_release_at_least
-- Args: min hold µs, name, token. As release_at_least, with the fence kept
-- as in tidb_refresh, and the owner released as in release_at_least.
UPDATE /*+ SET_VAR(tidb_retry_limit=0) */ `sqllock`
SET expires_at = acquired_at + INTERVAL ? MICROSECOND,
    fence = fence + LAST_INSERT_ID(fence + 1) * 0
      + (18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0,
    owner = IF(LENGTH(owner) = 32, TO_BASE64(UNHEX(owner)), owner)
WHERE name = ? AND kind = 'L' AND ? IN (owner, IF(LENGTH(owner) = 24, LOWER(HEX(FROM_BASE64(owner))), NULL));

-- name: tidb_inspect
-- Args: name. As inspect: no row when the name was never taken, the lease
-- columns NULL when it was released.
SELECT IF(owner = '', NULL, holder), fence,
       IF(owner = '', NULL, expires_at > UTC_TIMESTAMP(6)),
       IF(owner = '', NULL, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)),
       IF(owner = '', NULL, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), acquired_at)),
       IF(owner = '', NULL, LENGTH(owner) = 24)
FROM `sqllock`
WHERE name = ? AND kind = 'L';

-- name: tidb_list
-- No args. As list.
SELECT name, holder, fence, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at),
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), acquired_at)
FROM `sqllock`
WHERE kind = 'L' AND owner <> '' AND expires_at > UTC_TIMESTAMP(6)
ORDER BY name;

-- name: tidb_lease
-- Args: name. As lease: nothing when the name is free.
SELECT owner, holder, fence, expires_at > UTC_TIMESTAMP(6),
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), FALSE
FROM `sqllock`
WHERE name = ? AND kind = 'L' AND owner <> '';

-- name: tidb_lock_delay
-- Args: as lock_delay. The same: a name's one row keeps its fence.
UPDATE /*+ SET_VAR(tidb_retry_limit=0) */ `sqllock`
SET expires_at = UTC_TIMESTAMP(6) + INTERVAL LAST_INSERT_ID(
      COALESCE(?, GREATEST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), 0) DIV 3
                  + LEAST(GREATEST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), 0) DIV 5, 6000000))
      + (18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0) MICROSECOND,
    owner = ?, holder = ?
WHERE name = ? AND kind = 'L' AND owner = ?;

-- name: tidb_once_record
-- Args: name, token. Insert id: the lease row's fence plus one when the
-- completion record is there, 0 when the lease is not ours, and then nothing
-- is written. TiDB runs an autocommit statement optimistically, taking no
-- lock before commit, and FOR UPDATE inside INSERT ... SELECT does not make
-- it check the lease row then: a record could commit after a takeover, and
-- the new holder would run fn again. So the statement writes the lease row
-- too, flipping the lowest bit of acquired_at's microseconds as check does
-- (the one ON DUPLICATE KEY UPDATE assignment, which leaves a record that is
-- there already as it is). A takeover committed after the statement read the
-- lease row then fails its commit with a write conflict (9007), and the
-- statement sent again finds the lease not ours. A record already there was
-- written by an earlier attempt of ours, whose reply was lost: a record
-- another holder wrote first would have stopped fn from running.
INSERT /*+ SET_VAR(tidb_retry_limit=0) */ INTO `sqllock` (name, kind, owner, holder, fence, acquired_at, expires_at)
SELECT l.name, k.kind_, l.owner, l.holder, LAST_INSERT_ID(l.fence + 1) * 0,
       UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
FROM `sqllock` AS l JOIN (SELECT 'D' AS kind_ UNION ALL SELECT 'L') AS k
WHERE l.name = ? AND l.kind = 'L' AND l.owner = ?
ON DUPLICATE KEY UPDATE
  acquired_at = IF(`sqllock`.kind = 'L',
                   `sqllock`.acquired_at + INTERVAL IF(MOD(MICROSECOND(`sqllock`.acquired_at), 2) = 0, 1, -1) MICROSECOND,
                   `sqllock`.acquired_at);

-- name: tidb_all_acquire
-- Holes: the rows (tidb_all_acquire_row). The one-row form of all_acquire:
-- all or nothing the same way (error 1690 on a live lease of another
-- owner); each name's fence grows by one, or starts at the clock for a new
-- name, and is read back with all_fences, since no insert id can carry
-- them here. The fence assignment alone reads the old row: when it does not
-- fail, every row is taken, and the other assignments take the row's new
-- values, but for the expiry, never moved earlier (as in tidb_acquire).
-- VALUES() is the row the INSERT would have written.
INSERT /*+ SET_VAR(tidb_retry_limit=0) */ INTO `sqllock` (name, kind, owner, holder, fence, acquired_at, expires_at)
VALUES ?
ON DUPLICATE KEY UPDATE
  fence = IF(owner = '' OR owner = VALUES(owner) OR expires_at <= UTC_TIMESTAMP(6),
             fence + 1, fence + 1 + 18446744073709551615),
  acquired_at = UTC_TIMESTAMP(6),
  holder = VALUES(holder),
  owner = VALUES(owner),
  expires_at = GREATEST(expires_at, VALUES(expires_at));

-- name: tidb_all_acquire_row
-- A row of tidb_all_acquire. Holes: name, token, holder, ttl µs.
(?, 'L', ?, ?, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))
   + (18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0,
 UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND);

-- name: tidb_all_refresh
-- Holes: ttl µs, token, the names. all_refresh for the one-row forms,
-- where a name has no fence row and its lease row is never deleted (a
-- release empties its owner): a lease row of the set not ours or expired
-- fails the statement with 1690, and the expiry never moves earlier.
UPDATE /*+ SET_VAR(tidb_retry_limit=0) */ `sqllock`
SET expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
    acquired_at = acquired_at + INTERVAL IF(MOD(MICROSECOND(acquired_at), 2) = 0, 1, -1) MICROSECOND
WHERE kind = 'L'
  AND (18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0 = 0
  AND IF(owner = ? AND expires_at > UTC_TIMESTAMP(6), 0, fence + 1 + 18446744073709551615) = 0
  AND name IN (?);

-- name: tidb_all_release
-- Holes: token, the names. As tidb_release, for a set.
UPDATE /*+ SET_VAR(tidb_retry_limit=0) */ `sqllock`
SET owner = '', holder = '', expires_at = UTC_TIMESTAMP(6)
WHERE kind = 'L' AND owner = ? AND name IN (?);

-- Counting semaphores (semaphore.go). A semaphore of n slots on name keeps its
-- rows under names derived from it with the mark M = 0x00 'slot', which no
-- lock name may end with (nor with M and two digits; checkName refuses
-- them), so they never meet a lock's rows:
--   P = name M, kind 'F': its fence, increasing across all its slots, in
--       fence; its slot count n, as decimal text, in owner (unused in a
--       lock's fence row);
--   P followed by two decimal digits, 01 to 64, kind 'L': slot i, an
--       ordinary lease row, so refresh, release, release_at_least and check
--       serve a slot's Lock unchanged. A slot not held is a row with owner ''
--       and an expiry in the past, or no row.
-- Every name of the semaphore lies in [P, Q), Q being P with its last byte
-- one higher ('slou'); a lock whose name starts with P may lie there too,
-- so a statement over the range either is guarded by a token only slots
-- carry, or the Go side keeps just the semaphore's names.

-- name: slot_acquire
-- Args: mode, P, n; then for each slot row i = 1..v, i, P i, i, token, i,
-- holder, i, ttl µs; then P; then token, n, mode, v, token, holder, ttl µs,
-- token, n. n as text. mode is 128 when v = n, 256
-- when v > n (the Go side widens the visit to check a smaller n; v < n
-- never). The slot row (the second of VALUES) is written once here; the Go
-- side repeats it for slots 1..v, v at most 64.
-- Insert id: the fence times 128 plus the slot taken (1..64) when a slot was
-- taken (the fence is above 2^32: it starts at the server's clock in µs);
-- 0 when all n slots are held by others; 1 when the slot count was changed
-- to n (every slot was free), and the Go side sends the statement again;
-- 1000 + r when the semaphore has r slots, not n, and one is held; 2000 + r
-- when it has r > v slots, and the Go side sends the statement again with
-- v = r, to see whether they are all free.
--
-- Rows are written in order, each under its row lock until commit, and
-- every acquire of the semaphore writes the fence row first: so acquires of
-- one semaphore take turns, and take their row locks in the same order
-- (fence row, slots in order, fence row again), which cannot deadlock.
-- Renewals and releases lock one slot row and nothing else.
--
-- A mark passes from row to row through LAST_INSERT_ID(), as in acquire:
--   128 + x  take: x = 0 while no slot is taken, else the slot taken;
--   256      check (another n was recorded): no slot seen live so far;
--   384      check: some slot seen live;
--   512 + r  refused: the semaphore has r slots, more than this visits.
-- 1. The fence row, first visit. Inserted (a new semaphore): it records n,
--    and the mark is mode. Found: the mark is mode when it records n, check
--    when it records an r the visit covers (r <= v), else 512 + r. Nothing
--    else changes; its fence is kept (LAST_INSERT_ID(..) * 0 + fence).
-- 2. Each slot row i: its VALUES part first turns mark 128 into 128 + i,
--    taking the slot tentatively, so a new row (the insert) is written
--    taken, with token, holder and expiry. Found (the update), the slot's
--    number is read back from its name (its last two bytes, digits): mark
--    128 + i then came from this row's VALUES, and the slot is taken if it is free
--    (owner '' or ended by the server's clock: an attached slot's end is
--    its session's, the top of this file) or already ours (a retry after
--    an unknown outcome), else the mark falls back to 128. A slot
--    before it taken (128 + j, j < i) leaves it alone, even when it is
--    ours: a send that runs late must not free the slot a later send of
--    the token took and returned, so a retry that finds an earlier slot
--    free holds two, and the Go side deletes the one it does not report
--    (slotCall.taken). A slot taken again that was ours keeps its
--    acquired_at, which release_at_least counts from, and, while it lives,
--    its own expiry when later (GREATEST, as in acquire_attached: an
--    attached slot's 9999, so it stays attached); a slot taken that had
--    ended, attached or not, gets now + ttl. In check mode a live slot
--    (ours counts; an attached one by its session) turns 256 into 384; a
--    new slot row is inserted free. Reading the session costs every slot
--    acquire a second open of the table (docs/performance.md).
-- 3. The fence row again (the same key: the update meets the row as step 1
--    left it). Its VALUES part adds 65536 to the mark, which tells the update
--    this is the second visit. A slot taken: the fence becomes the greater
--    of its old value plus one and the server's clock in µs (as acquire's),
--    read under the row lock, so fences follow the order in which
--    acquisitions commit across all slots; the insert id carries it times
--    128 plus the slot, which the servers carry until it passes 2^63 (the
--    fence past 2^56 µs, the year 4250: GREATEST of an unsigned and a
--    signed value is a DECIMAL, which LAST_INSERT_ID takes as signed; the
--    statement then fails, never answers wrongly). Check with no slot live: owner records n (the
--    semaphore is resized), insert id 1. Otherwise the insert id says why
--    nothing was taken, and nothing changes.
-- Every row goes through the one ON DUPLICATE KEY UPDATE. Its first
-- assignment reads only the old row and sets the mark; the others read the
-- mark, the name (never assigned) and owner, assigned last, so every
-- assignment sees the old owner whether the server assigns left to right or
-- every assignment against the old row (SIMULTANEOUS_ASSIGNMENT). A slot
-- row's fence column stays 0, as a lease row's does. CASTs of the name's
-- last two bytes run only on slot rows (inside IF(kind = 'L', ..)), and of
-- owner only on the fence row (kind 'F'), where they are digits: a strict
-- sql_mode would fail the statement on a cast that truncates. Unsigned
-- subtractions are taken only where the mark is at least what they
-- subtract. The primary key is the only unique key, so the statement is
-- safe for statement-based replication, as acquire is.
INSERT INTO `sqllock` (fence, name, kind, owner, holder, acquired_at, expires_at)
VALUES
  (LAST_INSERT_ID(?) * 0
     + (18446744073709551615 + (@@autocommit = 0 /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */) + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND ABS(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))) > 1000000)) * 0 + (9223372036854775807 + (ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) AND @@global.read_only <> 0)) * 0, ?, 'F', ?, '', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)),
  (LAST_INSERT_ID(IF(LAST_INSERT_ID() = 128, 128 + ?, LAST_INSERT_ID())) * 0, ?, 'L', IF(LAST_INSERT_ID() = 128 + ?, ?, ''), IF(LAST_INSERT_ID() = 128 + ?, ?, ''), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL IF(LAST_INSERT_ID() = 128 + ?, ?, 0) MICROSECOND),
  (LAST_INSERT_ID(LAST_INSERT_ID() + 65536) * 0, ?, 'F', '', '', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
  fence = IF(kind = 'L',
             LAST_INSERT_ID(IF(LAST_INSERT_ID() = 128 + CAST(RIGHT(name, 2) AS UNSIGNED),
                               IF(owner = '' OR owner = ? OR IF(expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(`sqllock`.owner, 16) AND s.kind = 'S'), '1000-01-01'), expires_at) <= UTC_TIMESTAMP(6), LAST_INSERT_ID(), 128),
                               IF(LAST_INSERT_ID() = 256 AND owner <> '' AND IF(expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(`sqllock`.owner, 16) AND s.kind = 'S'), '1000-01-01'), expires_at) > UTC_TIMESTAMP(6), 384, LAST_INSERT_ID()))) * 0,
          IF(LAST_INSERT_ID() < 65536,
             LAST_INSERT_ID(IF(owner = ?, ?, IF(CAST(owner AS UNSIGNED) <= ?, 256, 512 + CAST(owner AS UNSIGNED)))) * 0 + fence,
          IF(LAST_INSERT_ID() BETWEEN 65536 + 129 AND 65536 + 192,
             LAST_INSERT_ID(GREATEST(fence + 1, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))) * 128
                            + LAST_INSERT_ID() - 65536 - 128) DIV 128,
             LAST_INSERT_ID(CASE LAST_INSERT_ID() - 65536
                              WHEN 128 THEN 0
                              WHEN 256 THEN 1
                              WHEN 384 THEN 1000 + CAST(owner AS UNSIGNED)
                              ELSE 2000 + LAST_INSERT_ID() - 65536 - 512 END) * 0 + fence))),
  acquired_at = IF(IF(kind = 'L', LAST_INSERT_ID() = 128 + CAST(RIGHT(name, 2) AS UNSIGNED), FALSE) AND owner <> ?,
                   UTC_TIMESTAMP(6), acquired_at),
  holder = IF(IF(kind = 'L', LAST_INSERT_ID() = 128 + CAST(RIGHT(name, 2) AS UNSIGNED), FALSE), ?,
              holder),
  expires_at = IF(IF(kind = 'L', LAST_INSERT_ID() = 128 + CAST(RIGHT(name, 2) AS UNSIGNED), FALSE), GREATEST(IF(IF(expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(`sqllock`.owner, 16) AND s.kind = 'S'), '1000-01-01'), expires_at) > UTC_TIMESTAMP(6), expires_at, '1000-01-01'),
                           UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
                  expires_at),
  owner = IF(IF(kind = 'L', LAST_INSERT_ID() = 128 + CAST(RIGHT(name, 2) AS UNSIGNED), FALSE), ?,
             IF(kind = 'F' AND LAST_INSERT_ID() = 1, ?, owner));

-- name: slot_release
-- Args: P, Q, token. Deletes every slot row of the semaphore held by
-- token, for an acquire whose outcome is unknown (the lease it may have
-- taken could be on any slot): affected rows, with or without
-- clientFoundRows, count the slots it held. The fence row (name P, kind 'F')
-- is not a lease row. With a slot's name for P or Q, it deletes the
-- token's slots before or after that one (slotCall.releaseOthers).
DELETE FROM `sqllock` WHERE name > ? AND name < ? AND kind = 'L' AND owner = ?;

-- name: slot_list
-- Args: P, Q. The semaphore's rows in name order: the fence row
-- first (its owner is the slot count), then each slot row with its holder,
-- whether it is held (an owner, and live by the server's clock; an
-- attached slot by its session's end) and the lease left.
SELECT name, kind, IF(kind = 'F', owner, holder), fence,
       owner <> '' AND IF(expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(`sqllock`.owner, 16) AND s.kind = 'S'), '1000-01-01'), expires_at) > UTC_TIMESTAMP(6),
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), IF(expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(`sqllock`.owner, 16) AND s.kind = 'S'), '1000-01-01'), expires_at))
FROM `sqllock`
WHERE name >= ? AND name < ?
ORDER BY name, kind;

-- A frozen holder (internal/engine/frozen.go). A holder stopped inside its Lock.Check
-- transaction (SIGSTOP, a paused VM, a debugger) keeps its lease row locked
-- (check writes it) until the transaction ends: for an idle connection,
-- wait_timeout, 8 h by default. Every acquire of the name waits behind it
-- though the lease has ended, and when the holder continues, its write
-- commits. So an acquire that waits for its row reads the lease from
-- another connection, and once the lease has been over for a bound
-- (frozenAfter) while an idle transaction still holds its row, the Client
-- ends that transaction by KILL of its connection: it rolls back, and the
-- waiting acquire goes on and decides as ever.

-- name: frozen_lease
-- Args: name. The lease's holder and how long ago it ended by the server's
-- clock, in µs (negative: how long it has left). A plain SELECT in
-- autocommit is a consistent read: it takes no lock, so it does not wait
-- behind the transaction that holds the row, and it reads the lease as last
-- committed (check's own change, uncommitted, moves only acquired_at).
SELECT holder, TIMESTAMPDIFF(MICROSECOND, IF(expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(`sqllock`.owner, 16) AND s.kind = 'S'), '1000-01-01'), expires_at), UTC_TIMESTAMP(6))
FROM `sqllock`
WHERE name = ? AND kind = 'L';

-- name: frozen_blocker_mariadb
-- Args: name, name, bound µs. The connections whose transactions hold the
-- name's lease row locked while another waits for it, on MariaDB (and
-- MySQL 5.7's tables, which the Client does not use): the lock-wait
-- tables list a lock only while a transaction waits for it, so this is
-- sent while the acquire waits. Needs PROCESS. InnoDB writes a row's key
-- in lock_data as the hex of each column: 0x<name>, 0x4C ('L'). Only a
-- blocker that holds its lock (not one queued ahead, in LOCK WAIT) and runs
-- no statement (idle inside its transaction, as a stopped client leaves
-- it; a takeover's acquire, committing, runs one) is named, and only while
-- the lease, read again here (a consistent read), has been over for the
-- bound: a live lease's holder is never named.
SELECT DISTINCT t.trx_mysql_thread_id
FROM information_schema.INNODB_LOCK_WAITS AS w
JOIN information_schema.INNODB_LOCKS AS l ON l.lock_id = w.blocking_lock_id
JOIN information_schema.INNODB_TRX AS t ON t.trx_id = w.blocking_trx_id
WHERE l.lock_table = CONCAT('`', DATABASE(), '`.`', 'sqllock', '`')
  AND l.lock_index = 'PRIMARY' AND l.lock_data = CONCAT('0x', HEX(?), ', 0x4C')
  AND t.trx_state = 'RUNNING' AND t.trx_query IS NULL
  AND EXISTS (SELECT 1 FROM `sqllock`
              WHERE name = ? AND kind = 'L' AND IF(expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(`sqllock`.owner, 16) AND s.kind = 'S'), '1000-01-01'), expires_at) <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND);

-- name: frozen_blocker_mysql
-- Args: name, name, bound µs. frozen_blocker_mariadb on MySQL 8.0 and
-- later, from performance_schema (SELECT on it; no PROCESS): the blocker's
-- lock granted, its connection idle ('Sleep'). information_schema's
-- INNODB_TRX and PROCESSLIST are not read: MySQL fails a query of a
-- session's statement text it cannot convert to utf8mb3 (3854), which a
-- binary lock name in another session's statement can be.
SELECT DISTINCT t.PROCESSLIST_ID
FROM performance_schema.data_lock_waits AS w
JOIN performance_schema.data_locks AS l ON l.ENGINE_LOCK_ID = w.BLOCKING_ENGINE_LOCK_ID AND l.ENGINE = w.ENGINE
JOIN performance_schema.threads AS t ON t.THREAD_ID = w.BLOCKING_THREAD_ID
WHERE l.OBJECT_SCHEMA = DATABASE() AND l.OBJECT_NAME = 'sqllock'
  AND l.INDEX_NAME = 'PRIMARY' AND l.LOCK_STATUS = 'GRANTED' AND l.LOCK_DATA = CONCAT('0x', HEX(?), ', 0x4C')
  AND t.PROCESSLIST_COMMAND = 'Sleep'
  AND EXISTS (SELECT 1 FROM `sqllock`
              WHERE name = ? AND kind = 'L' AND IF(expires_at = '9999-12-31 23:59:59.999999', COALESCE((SELECT s.expires_at FROM `sqllock` AS s WHERE s.name = LEFT(`sqllock`.owner, 16) AND s.kind = 'S'), '1000-01-01'), expires_at) <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND);

-- name: frozen_kill
-- Holes: a connection id, as a number's text (MySQL takes no parameter in
-- KILL, 6413). Ends the connection and rolls its transaction back (KILL
-- QUERY would not: an idle connection runs no query). An account may kill
-- its own connections; another account's need CONNECTION_ADMIN or SUPER
-- (MySQL), CONNECTION ADMIN or SUPER (MariaDB), else error 1095.
KILL CONNECTION ?
