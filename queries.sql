-- Every statement sqllock sends, each under a "-- name:" marker. The Go side
-- splits this file once, puts the configured table name in place of
-- `sqllock`, and prepares each statement once per Client.
--
-- Time always comes from the server: UTC_TIMESTAMP(6) is fixed for the whole
-- statement and does not depend on the session time_zone. A fence is the
-- server's clock in microseconds since 1970 when a name is taken afresh, and
-- one more than the previous fence (at least) when an expired lease is taken
-- over; see doc.go for what that rests on.
--
-- Results are read from the OK packet's insert id, set with
-- LAST_INSERT_ID(expr): the table has no AUTO_INCREMENT column, so the id is
-- the last LAST_INSERT_ID(expr) the statement evaluated, or 0 if it evaluated
-- none. Affected rows are never used to decide anything: the DSN flag
-- clientFoundRows changes what they mean.

-- name: acquire
-- Args: name, token, holder, ttl µs; then token, token, token, holder,
-- token, token, ttl µs.
-- Insert id: the fence when acquired, 0 when another owner's live lease
-- stands. The VALUES part runs for every call; when the row exists, the
-- fence assignment overwrites the insert id, so it always has the last word.
--
-- The UPDATE part must give the same row whether the server assigns left to
-- right (each assignment seeing the ones before it: MySQL, MariaDB's
-- default) or every assignment against the old row (MariaDB's
-- SIMULTANEOUS_ASSIGNMENT). The condition "ours or expired" is stable under
-- both: an assignment that made it true for a takeover (owner := token)
-- keeps it true. So fence and acquired_at, which must tell a takeover from
-- our own retry, are assigned before owner changes, and expires_at, which
-- makes "expired" false, is assigned last.
INSERT INTO `sqllock` (name, owner, holder, fence, acquired_at, expires_at)
VALUES (?, ?, ?,
        LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))),
        UTC_TIMESTAMP(6),
        UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE
  -- Our own token: a retry after an unknown outcome; keep the fence.
  -- Expired: a takeover; the fence moves past the old one and the clock.
  -- Otherwise: not ours; report 0 (fence * 0, not a constant, so that no
  -- server folds the call away when the branch is not taken).
  fence = IF(owner = ?, LAST_INSERT_ID(fence),
             IF(expires_at <= UTC_TIMESTAMP(6),
                LAST_INSERT_ID(GREATEST(fence + 1, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))),
                fence + LAST_INSERT_ID(fence * 0))),
  acquired_at = IF(owner <> ? AND expires_at <= UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), acquired_at),
  holder = IF(owner = ? OR expires_at <= UTC_TIMESTAMP(6), ?, holder),
  owner = IF(expires_at <= UTC_TIMESTAMP(6), ?, owner),
  expires_at = IF(owner = ? OR expires_at <= UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, expires_at);

-- name: refresh
-- Args: ttl µs, name, token. Insert id: the fence when extended, 0 when the
-- lease is not ours or has expired (LAST_INSERT_ID in SET is evaluated only
-- for a row that matches; fence := fence changes nothing).
UPDATE `sqllock`
SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
    fence = LAST_INSERT_ID(fence)
WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6);

-- name: release
-- Args: name, token. Affected rows: 1 when the row was ours, 0 when not (a
-- DELETE counts the same with or without clientFoundRows). An expired lease
-- that nobody took over is still ours to release.
DELETE FROM `sqllock` WHERE name = ? AND owner = ?;

-- name: inspect
-- Args: name. One row, or none when the name has never been taken or was
-- released.
SELECT holder, fence, expires_at > UTC_TIMESTAMP(6),
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)
FROM `sqllock` WHERE name = ?;

-- name: autocommit
-- Sent once per Client: with autocommit off (a DSN's autocommit=0, or the
-- server's default) no statement above would ever commit.
SELECT @@SESSION.autocommit;
