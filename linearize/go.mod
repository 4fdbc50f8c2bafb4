module github.com/sqllock/sqllock/linearize

go 1.24.0

require github.com/anishathalye/porcupine v1.3.1
