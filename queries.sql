-- Every statement sqllock sends, each under a "-- name:" marker. The Go side
-- splits this file once, puts the configured table name in place of
-- `sqllock`, and prepares each statement once per Client.
--
-- A name has two rows (schema.sql): its lease ('L'), which Release deletes,
-- and its fence ('F'), which outlives every release so that fences keep
-- growing across release and re-acquire.
--
-- Time always comes from the server: UTC_TIMESTAMP(6) is fixed for the whole
-- statement and does not depend on the session time_zone.
--
-- Results are read from the OK packet's insert id, set with
-- LAST_INSERT_ID(expr): the table has no AUTO_INCREMENT column, so the id is
-- the last LAST_INSERT_ID(expr) the statement evaluated, or 0 if it evaluated
-- none. Within a statement, LAST_INSERT_ID() returns the last value set, which
-- carries a mark from the lease row to the fence row. Affected rows are never
-- used to decide anything: the DSN flag clientFoundRows changes their meaning.
--
-- Where a LAST_INSERT_ID(expr) sits in a branch that may not be taken, expr
-- refers to a column, so that no server can fold the call into a constant and
-- run it whether or not the branch is taken.

-- name: acquire
-- Args: name, token, holder, ttl µs, name; then token, holder, token, ttl µs.
-- Insert id: the fence when acquired, 0 when another owner's live lease
-- stands.
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
INSERT INTO `sqllock` (name, kind, owner, holder, fence, acquired_at, expires_at)
VALUES
  (?, 'L', ?, ?, LAST_INSERT_ID(1) * 0,
   UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
  (?, 'F', '', '',
   IF(LAST_INSERT_ID() = 1, LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))), 0),
   UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
  -- Lease row: the mark (its fence column stays 0). Fence row: the fence.
  fence = IF(kind = 'L',
             LAST_INSERT_ID(IF(owner = ?, 2, IF(expires_at <= UTC_TIMESTAMP(6), 1, 0)) + fence) * 0,
             IF(LAST_INSERT_ID() = 2, LAST_INSERT_ID(fence),
                IF(LAST_INSERT_ID() > 2, LAST_INSERT_ID(GREATEST(fence + 1, LAST_INSERT_ID())), fence))),
  acquired_at = IF(kind = 'L' AND LAST_INSERT_ID() = 1, UTC_TIMESTAMP(6), acquired_at),
  holder = IF(kind = 'L' AND LAST_INSERT_ID() IN (1, 2), ?, holder),
  owner = IF(kind = 'L' AND LAST_INSERT_ID() = 1, ?, owner),
  expires_at = IF(kind = 'L' AND LAST_INSERT_ID() IN (1, 2), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, expires_at);

-- name: refresh
-- Args: ttl µs, name, token. Insert id: 1 when extended, 0 when the lease is
-- not ours or has expired (LAST_INSERT_ID in SET is evaluated only for a row
-- that matches; a lease row's fence is 0, so the column does not change).
UPDATE `sqllock`
SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
    fence = LAST_INSERT_ID(fence + 1) * 0
WHERE name = ? AND kind = 'L' AND owner = ? AND expires_at > UTC_TIMESTAMP(6);

-- name: release
-- Args: name, token. Affected rows: 1 when the row was ours, 0 when not (a
-- DELETE counts the same with or without clientFoundRows). An expired lease
-- that nobody took over is still ours to release. The fence row stays.
DELETE FROM `sqllock` WHERE name = ? AND kind = 'L' AND owner = ?;

-- name: inspect
-- Args: name. No row when the name was never taken; the lease columns are
-- NULL when it was released.
SELECT l.holder, f.fence, l.expires_at > UTC_TIMESTAMP(6),
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), l.expires_at)
FROM `sqllock` AS f
LEFT JOIN `sqllock` AS l ON l.name = f.name AND l.kind = 'L'
WHERE f.name = ? AND f.kind = 'F';

-- name: autocommit
-- Sent once per Client: with autocommit off (a DSN's autocommit=0, or the
-- server's default) no statement above would ever commit.
SELECT @@SESSION.autocommit;
