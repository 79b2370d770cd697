package node

import (
	"fmt"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// What a peer may claim. The transport verifies who is at the other end of
// a connection (its certificate, signed by the cluster CA, names it); an
// envelope's own fields are the peer's say-so. So every node part an
// application sees is the verified peer's:
//
//   - an envelope whose sender names another node is refused, not
//     rewritten: a correct member never sends one, so it is an attempt to
//     pass as someone else, and running it under a corrected name would
//     hide that;
//   - a request's reply_to must name the sender's node too, and the
//     response goes to the verified sender whatever it says, so a member
//     cannot make this node answer a third one (a reflected reply);
//   - a response is taken only from the node that was asked (the
//     ResponseRegistry checks it).

// checkClaims reports an envelope from the verified peer from that names
// another node as its sender or as the node its reply goes to.
func checkClaims(from string, env *pb.Envelope) error {
	if s, _ := parseLoose(env.GetSender()); s.Node != from {
		return fmt.Errorf("%w: sender %q is not on the verified peer %q", ErrSenderMismatch, env.GetSender(), from)
	}
	if env.GetRpc().GetKind() == pb.RpcMeta_REQUEST {
		if rt := env.GetRpc().GetReplyTo(); rt != "" {
			if a, _ := parseLoose(rt); a.Node != from {
				return fmt.Errorf("%w: reply_to %q is not on the verified peer %q", ErrSenderMismatch, rt, from)
			}
		}
	}
	return nil
}

// refusedClaim counts and logs (once a minute per peer) an envelope that
// checkClaims refused.
func (n *Node) refusedClaim(from string, err error) {
	n.stats.senderMismatch.Add(1)
	if ok, suppressed := n.claimLog.Allow(from); ok {
		n.log.Warn("refused an envelope that claims another node", "peer", from, "err", err, "suppressed", suppressed)
	}
}
