// Package entlock runs [sqllock.Lock.Check] first in an ent transaction.
//
// ent's transactions, the generated client's *ent.Tx and the driver's
// dialect.Tx alike, do not hand out the *sql.Tx their writes go through,
// and Check needs it. Give the generated client the driver that [Driver]
// returns, and begin a transaction with a context from [WithCheck]: the
// transaction runs Check before anything else, and the Tx call fails with
// Check's error, which wraps [sqllock.ErrNotHeld] once the lease is lost.
//
//	drv := entsql.OpenDB(dialect.MySQL, db) // db: the *sql.DB the Client also uses
//	client := ent.NewClient(ent.Driver(entlock.Driver(drv)))
//	...
//	tx, err := client.Tx(entlock.WithCheck(ctx, lock))
//	if err != nil {
//		return err // errors.Is(err, sqllock.ErrNotHeld): write nothing
//	}
package entlock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"

	"github.com/sqllock/sqllock"
)

type lockKey struct{}

// WithCheck returns a copy of ctx that makes a transaction begun with it by
// a [Driver] run l.Check first. Only the transaction's beginning reads it.
func WithCheck(ctx context.Context, l *sqllock.Lock) context.Context {
	return context.WithValue(ctx, lockKey{}, l)
}

// Driver returns drv, whose transactions begun with a context from
// [WithCheck] run [sqllock.Lock.Check] first; everything else, and every
// transaction begun with another context, is drv's own. Its Tx and BeginTx
// return the error of the Check, after rolling the transaction back.
func Driver(drv *entsql.Driver) dialect.Driver {
	return checkingDriver{drv}
}

type checkingDriver struct {
	*entsql.Driver
}

// Tx begins a transaction, as ent's generated client's Tx does.
func (d checkingDriver) Tx(ctx context.Context) (dialect.Tx, error) {
	return d.BeginTx(ctx, nil)
}

// BeginTx begins a transaction with opts, as the generated client's BeginTx
// does, and runs the Check ctx carries.
func (d checkingDriver) BeginTx(ctx context.Context, opts *sql.TxOptions) (dialect.Tx, error) {
	tx, err := d.Driver.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	l, _ := ctx.Value(lockKey{}).(*sqllock.Lock)
	if l == nil {
		return tx, nil
	}
	// entsql.Driver's transaction is an *entsql.Tx over the *sql.Tx it began.
	var stx *sql.Tx
	if etx, ok := tx.(*entsql.Tx); ok {
		stx, _ = etx.ExecQuerier.(*sql.Tx)
	}
	if stx == nil {
		err = fmt.Errorf("entlock: the driver's transaction is a %T, not an *entsql.Tx over a *sql.Tx", tx)
	} else {
		err = l.Check(ctx, stx)
	}
	if err != nil {
		return nil, errors.Join(err, tx.Rollback())
	}
	return tx, nil
}
