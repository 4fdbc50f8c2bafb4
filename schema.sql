-- The one table sqllock needs. Client.CreateTable runs this file with the
-- configured table name in place of `sqllock`; it can also be run by hand:
--   mysql -h HOST -u USER DATABASE < schema.sql
--
-- VARBINARY makes names and tokens compare byte for byte, whatever the
-- server's or table's collation: 'Job', 'job' and 'job ' are three locks.
-- DATETIME(6) is written only from UTC_TIMESTAMP(6), so the session
-- time_zone never shifts it (TIMESTAMP would convert, and ends in 2038).
-- Each name has two rows. kind 'L' is the lease: owner token, holder,
-- acquired_at and expires_at (its fence column stays 0); Release deletes it.
-- kind 'F' is the name's fence: the last fencing token issued, kept across
-- releases so that fences never go back (its other columns are unused).
-- kind 'D' is Client.Once's completion record, copied from the lease row of
-- the run that succeeded (owner, holder; acquired_at when it was written).
-- kind 'S' is a session, named by the first 16 characters of its leases'
-- owner: a lease whose expires_at is 9999-12-31 23:59:59.999999 lasts while
-- its session's expires_at is ahead; its fence counts the changes others
-- made to its leases (queries.sql).
-- The primary key is the only unique key, which keeps the upsert safe for
-- statement-based replication.
CREATE TABLE IF NOT EXISTS `sqllock` (
  name        VARBINARY(255)  NOT NULL,
  kind        BINARY(1)       NOT NULL,
  owner       VARBINARY(32)   NOT NULL,
  holder      VARBINARY(255)  NOT NULL,
  fence       BIGINT UNSIGNED NOT NULL,
  acquired_at DATETIME(6)     NOT NULL,
  expires_at  DATETIME(6)     NOT NULL,
  PRIMARY KEY (name, kind)
) ENGINE=InnoDB;
