package sqllock

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
)

// tokenBytes is the size of an owner token: 128 random bits, so that two
// owners never share one, whoever they are and wherever they run (a
// hostname or a process id can repeat; 2^128 does not).
const tokenBytes = 16

// newToken returns a fresh owner token as 32 lowercase hex digits, which fit
// the VARBINARY(32) owner column and read well in the mysql client.
func newToken() (string, error) {
	var b [tokenBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// releasedToken returns the owner a release with a minimum hold leaves on a
// lease of token (queries.sql, release_at_least): TO_BASE64(UNHEX(token)),
// which no token equals, so no statement of the token touches the lease
// again; a forced release deletes it by this owner.
func releasedToken(token string) string {
	b, err := hex.DecodeString(token)
	if err != nil {
		return token
	}
	return base64.StdEncoding.EncodeToString(b)
}
