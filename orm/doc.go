// Package orm holds sqllock's examples and tests with the ORMs people use:
// gorm (gorm.io/gorm), sqlx (github.com/jmoiron/sqlx), ent (entgo.io/ent)
// and bun (github.com/uptrace/bun), each on MySQL and MariaDB. Each makes a
// sqllock.Client from the ORM's handle and calls Lock.Check in the ORM's
// own transaction, the one its writes go through: a write checked so is
// refused once the lease is lost. docs/orms.md shows the snippets.
//
// The module is one of its own, so that the library depends on none of
// them. sqlx's and bun's transactions embed the *sql.Tx that Check takes,
// and gorm's holds it in its Statement's ConnPool; ent's hide theirs, so
// package entlock runs Check as ent begins one.
package orm
