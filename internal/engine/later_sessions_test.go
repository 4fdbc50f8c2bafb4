package engine

import "testing"

// The session statements are proven once, before the first session, and
// the proof leaves no row: neither its lease nor its session's.
func TestServer_ProveSessions_once(t *testing.T) {
	provenOnce(t, LaterSessions, func(srv *Server) string {
		if !srv.Sessions() {
			return "the Client keeps no session here"
		}
		return ""
	}, (*Server).ProveSessions)
}
