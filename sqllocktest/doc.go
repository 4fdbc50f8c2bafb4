// Package sqllocktest is an in-memory MySQL server (or MariaDB, with
// [WithMariaDB]) for tests of code that uses sqllock: it runs exactly the statements sqllock sends (its
// queries.sql and schema.sql), with the semantics the library depends on
// (the server's clock, LAST_INSERT_ID(expr) and the OK packet's insert id,
// the affected rows of INSERT ... ON DUPLICATE KEY UPDATE, row locks held by
// a Lock.Check transaction, GET_LOCK per connection), behind a
// database/sql/driver Connector. No database, no network, no driver.
//
//	srv := sqllocktest.New(t)          // the table sqllock is created
//	locks, err := sqllock.New(srv.DB()) // as with a real *sql.DB
//
// The test owns the server's clock ([Server.Advance], [WithFrozenClock]) and
// its faults: [Server.Expire] ends a lease now, [Server.Inject] makes the next
// statement of a kind fail with a server error ([ServerError]) or a lost
// connection ([ErrLostConnection]), with its work done or not, and
// [Server.Down] and [Server.Up] stop and restart the server.
//
// Any other SQL fails with an error that says the fake does not implement
// it, naming the statement, unless [WithHandler] gives a [Handler] that
// answers it (SQL that names one of the fake's tables stays refused, never
// the Handler's): so a Lock.Check transaction that also writes your own tables
// (the pattern docs/usage.md recommends) runs on the fake, your Handler
// keeping those tables and applying a transaction's writes when it commits
// ([Tx.OnCommit]); see [ExampleWithHandler]. sqllock's own tests run on the fake as one
// more server, and its every answer is compared with MySQL's and
// MariaDB's, so that where the fake and the server differ a test fails
// (docs/testing.md in the repository lists the tests that need a real
// server's own behaviour).
package sqllocktest
