package engine

import "testing"

// The sets' statements are proven once, at the first set, and the proof
// leaves no row.
func TestServer_ProveSets_once(t *testing.T) {
	provenOnce(t, LaterSets, func(srv *Server) string {
		if srv.Forms().RefusesSets() {
			return "the Client refuses sets here before their proof"
		}
		return ""
	}, (*Server).ProveSets)
}
