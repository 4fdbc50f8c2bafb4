// Command nightly is a job that cron starts on every host through
// `sqllock run`, which runs it on one of them at a time:
//
//	0 3 * * *  SQLLOCK_DSN='cron:secret@tcp(db:3306)/ops' sqllock run -q --min-hold 10m nightly-report -- /usr/local/bin/nightly
//
// It writes its report with the fence `sqllock run` gives it in
// SQLLOCK_FENCE, in the statement that writes: a run whose lease was lost
// (its host paused past the ttl) cannot overwrite a later run's report.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	_ "github.com/go-sql-driver/mysql"
)

func main() {
	fence, err := strconv.ParseUint(os.Getenv("SQLLOCK_FENCE"), 10, 64)
	if err != nil {
		log.Fatal("nightly: run it under sqllock run, which sets SQLLOCK_FENCE")
	}
	db, err := sql.Open("mysql", os.Getenv("SQLLOCK_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	// sqllock run sends SIGTERM when the lease is lost.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := writeReport(ctx, db, fence); err != nil {
		log.Fatal(err)
	}
}

var errStale = errors.New("a later run has written the report")

// writeReport writes the report unless a run with a higher fence has.
func writeReport(ctx context.Context, db *sql.DB, fence uint64) error {
	for _, q := range createReport {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	// ... the report's work ...
	// One statement compares the fence and writes: nothing can come between.
	// written_at changes the row even when nothing else would, so that no
	// row affected means a higher fence was there.
	res, err := db.ExecContext(ctx,
		"UPDATE nightly_report SET fence = ?, runs = runs + 1, written_at = NOW(6) WHERE id = 1 AND fence <= ?",
		fence, fence)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	return fmt.Errorf("fence %d refused: %w", fence, errStale)
}

// A fence is about 2^51 (the server's clock in microseconds): BIGINT UNSIGNED.
var createReport = []string{`CREATE TABLE IF NOT EXISTS nightly_report (
	id INT PRIMARY KEY,
	fence BIGINT UNSIGNED NOT NULL,
	runs INT NOT NULL,
	written_at DATETIME(6) NOT NULL
)`, "INSERT IGNORE INTO nightly_report VALUES (1, 0, 0, NOW(6))"}
