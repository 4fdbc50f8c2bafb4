package main

import (
	"errors"
	"regexp"
	"strings"

	"github.com/sqllock/sqllock"
)

// serverErr matches the number of a server error as MySQL drivers print it.
var serverErr = regexp.MustCompile(`Error (\d+)( \([0-9A-Z]{5}\))?:`)

// errClass names the kind of err, so that a run can count its errors by
// kind: the server error number (with 1180's handler error), the
// library's sentinel, or the network failure.
func errClass(err error) string {
	msg := err.Error()
	if m := serverErr.FindStringSubmatch(msg); m != nil {
		if m[1] == "1180" {
			if i := strings.Index(msg, "Got error "); i >= 0 {
				rest := msg[i+len("Got error "):]
				if j := strings.IndexAny(rest, " \"'"); j > 0 {
					return "Error 1180 (error " + rest[:j] + " during COMMIT)"
				}
			}
		}
		return "Error " + m[1]
	}
	switch {
	case errors.Is(err, sqllock.ErrLockLost):
		return "lock lost"
	case errors.Is(err, sqllock.ErrNotHeld):
		return "not held"
	}
	for _, t := range []string{
		"connection refused", "invalid connection", "bad connection", "broken pipe",
		"connection reset", "unexpected EOF", "EOF", "i/o timeout", "context deadline exceeded",
		"context canceled",
	} {
		if strings.Contains(msg, t) {
			return t
		}
	}
	if len(msg) > 60 {
		msg = msg[:60] + "..."
	}
	return msg
}

// conflict reports whether err says the server rolled the statement back
// for a conflict with another writer (a deadlock, a cluster certification
// conflict): nothing of it was applied.
func conflict(err error) bool {
	switch errClass(err) {
	case "Error 1213", "Error 3101", "Error 1205", "Error 1180 (error 149 during COMMIT)":
		return true
	}
	return false
}

// movesOn reports whether err says the node cannot serve writes now: it is
// down, read-only (a Group Replication secondary, or a primary that lost
// the group), or not part of the cluster. A worker then moves on to the
// next DSN.
func movesOn(err error) bool {
	switch errClass(err) {
	case "Error 1290", "Error 1047", "Error 1053", "Error 3100", "Error 1792", "Error 1836",
		"connection refused", "invalid connection", "bad connection", "broken pipe",
		"connection reset", "unexpected EOF", "EOF", "i/o timeout", "context deadline exceeded":
		return true
	}
	return false
}
