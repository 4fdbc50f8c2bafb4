module github.com/sqllock/sqllock/compare

go 1.26.0

replace github.com/sqllock/sqllock => ../

require (
	cirello.io/pglock v1.16.1
	github.com/bsm/redislock v0.9.4
	github.com/go-redsync/redsync/v4 v4.18.1
	github.com/go-sql-driver/mysql v1.10.1
	github.com/lib/pq v1.10.9
	github.com/redis/go-redis/v9 v9.23.0
	github.com/sqllock/sqllock v0.0.0-00010101000000-000000000000
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/jackc/pgx/v5 v5.12.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
