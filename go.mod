module github.com/sqllock/sqllock

go 1.24.0
