package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// vitessVindexes gives the run's tables, when db's DSN names a sharded
// Vitess keyspace (vtgate answers VERSION() on no table with its own, and
// lists the keyspace's shards), the primary vindex on name that a table
// there needs before it is created (docs/servers.md). It returns what takes
// them away again, or nil where there was nothing to do.
func vitessVindexes(ctx context.Context, db *sql.DB, version string, tables ...string) (undo func(), err error) {
	if !strings.Contains(version, "Vitess") {
		return nil, nil
	}
	var keyspace string
	if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&keyspace); err != nil {
		return nil, fmt.Errorf("vtgate's keyspace: %w", err)
	}
	rows, err := db.QueryContext(ctx, "SHOW VITESS_SHARDS")
	if err != nil {
		return nil, fmt.Errorf("vtgate's shards: %w", err)
	}
	shards := 0
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			return nil, err
		}
		if strings.HasPrefix(s, keyspace+"/") {
			shards++
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if shards < 2 {
		return nil, nil
	}
	for _, t := range tables {
		if _, err := db.ExecContext(ctx, "ALTER VSCHEMA ON `"+keyspace+"`.`"+t+"` ADD VINDEX xxhash(name) USING xxhash"); err != nil {
			return nil, fmt.Errorf("vindex on %s.%s: %w", keyspace, t, err)
		}
	}
	return func() {
		for _, t := range tables {
			_, _ = db.Exec("ALTER VSCHEMA DROP TABLE `" + keyspace + "`.`" + t + "`")
		}
	}, nil
}
