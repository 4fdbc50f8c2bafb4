package engine

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/sqltext"
	"github.com/sqllock/sqllock/internal/testdsn"
)

// The Client's errors, as a Server's test wraps them.
var (
	errUnsupported   = errors.New("unsupported server")
	errBadTable      = errors.New("bad table")
	errReadOnly      = errors.New("read-only")
	errAutocommitOff = errors.New("autocommit off")
	errClosed        = errors.New("closed")
)

// testQueries are the statements of the repository's queries.sql, as the
// Client has them; testSchema is its schema.sql.
var (
	testQueries = sqltext.MustSplit(repoFile("queries.sql"))
	testSchema  = repoFile("schema.sql")
)

// repoFile returns the text of the repository's file name.
func repoFile(name string) string {
	b, err := os.ReadFile("../../" + name)
	if err != nil {
		panic(err)
	}
	return string(b)
}

const testHolder = "unit-test-holder"

// newTestServer returns a Server on db's table as a Client makes one.
func newTestServer(t testing.TB, db *sql.DB, table string) *Server {
	t.Helper()
	quoted, err := sqltext.QuoteTable(table)
	if err != nil {
		t.Fatal(err)
	}
	return New(Config{
		DB:        db,
		Queries:   testQueries,
		Table:     quoted,
		Holder:    testHolder,
		NameLen:   255,
		HolderLen: 255,
		Classify: func(err error) fault.Outcome {
			if errors.Is(err, errReadOnly) {
				return fault.Refused
			}
			return fault.Classify(err)
		},
		Retried: func(context.Context, string, string, error) {},
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Errorf:  fmt.Errorf,
		Errors:  Errors{Unsupported: errUnsupported, BadTable: errBadTable, ReadOnly: errReadOnly, AutocommitOff: errAutocommitOff},
		Token: func() (string, error) {
			var b [16]byte
			_, err := rand.Read(b[:])
			return hex.EncodeToString(b[:]), err
		},
		Released: func(token string) string {
			b, err := hex.DecodeString(token)
			if err != nil {
				return token
			}
			return base64.StdEncoding.EncodeToString(b)
		},
		Closed:         errClosed,
		CleanupTimeout: time.Second,
	})
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// wantErr fails t unless err wraps target and says each of subs.
func wantErr(t testing.TB, err, target error, subs ...string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("got %v, want an error wrapping %v", err, target)
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("got %v, want it to say %q", err, s)
		}
	}
}

func TestMain(m *testing.M) {
	testdsn.QuietDriver()
	testdsn.Parallel()
	os.Exit(m.Run())
}

// serverTable returns a pool on s and a table of the test's own there,
// made from schema.sql and dropped when t ends.
func serverTable(t *testing.T, s testdsn.Server) (*sql.DB, string) {
	t.Helper()
	db, err := sql.Open("mysql", s.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var b [4]byte
	_, _ = rand.Read(b[:])
	table := "engine_" + hex.EncodeToString(b[:])
	testdsn.Vindex(t, db, s, table, "name")
	if _, err := db.Exec(strings.ReplaceAll(testSchema, "`sqllock`", "`"+table+"`")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS `" + table + "`") })
	return db, table
}

// usedServer returns a pool on s, a table of the test's own there, and a
// Server on it that has made its first use.
func usedServer(t *testing.T, s testdsn.Server) (*sql.DB, string, *Server) {
	t.Helper()
	db, table := serverTable(t, s)
	srv := newTestServer(t, db, table)
	if err := srv.FirstUse(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	return db, table, srv
}
