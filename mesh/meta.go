package mesh

import (
	"bytes"
	"fmt"

	"github.com/meshnode/meshnode/internal/ident"
	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/proto"
)

// fillMeta returns a copy of meta with defaults for empty fields.
func fillMeta(meta *pb.NodeMeta, cluster string) *pb.NodeMeta {
	var out *pb.NodeMeta
	if meta == nil {
		out = &pb.NodeMeta{}
	} else {
		out = proto.Clone(meta).(*pb.NodeMeta)
	}
	if out.GetBootId() == "" {
		out.BootId = ident.NewBootID()
	}
	if len(out.GetProtocolVersions()) == 0 {
		out.ProtocolVersions = pb.SupportedVersions()
	}
	if out.GetCluster() == "" {
		out.Cluster = cluster
	}
	return out
}

// encodeMeta marshals meta deterministically and checks memberlist's limit.
func encodeMeta(meta *pb.NodeMeta) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(meta)
	if err != nil {
		return nil, fmt.Errorf("mesh: encode meta: %w", err)
	}
	if len(b) >= MaxMetaSize {
		return nil, fmt.Errorf("mesh: encode meta: %w (%d bytes, limit %d)", ErrMetaTooLarge, len(b), MaxMetaSize-1)
	}
	return b, nil
}

// CheckMeta reports whether meta fits in memberlist's node metadata
// (MaxMetaSize bytes once encoded): nil, or an error wrapping
// ErrMetaTooLarge.
func CheckMeta(meta *pb.NodeMeta) error {
	_, err := encodeMeta(meta)
	return err
}

// decodeMeta parses the metadata of a peer (bytes from the network).
func decodeMeta(b []byte) (*pb.NodeMeta, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("mesh: decode meta: %w: empty", ErrBadMessage)
	}
	var meta pb.NodeMeta
	if err := proto.Unmarshal(b, &meta); err != nil {
		return nil, fmt.Errorf("mesh: decode meta: %w: %w", ErrBadMessage, err)
	}
	return &meta, nil
}

// checkPeer is the AliveDelegate policy: the reason a peer is refused, or nil.
func checkPeer(cluster string, raw []byte) error {
	meta, err := decodeMeta(raw)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	if meta.GetCluster() != cluster {
		return fmt.Errorf("%w: cluster %q != %q", ErrRefused, meta.GetCluster(), cluster)
	}
	if !pb.Compatible(meta.GetProtocolVersions()) {
		return fmt.Errorf("%w: no compatible protocol version in %v (we speak %v)",
			ErrRefused, meta.GetProtocolVersions(), pb.SupportedVersions())
	}
	return nil
}

// User messages sent with memberlist's SendReliable start with a kind byte.
const msgLeaveIntent byte = 'L'

// encodeLeaveIntent builds the message a node sends to every peer just before
// memberlist.Leave, so peers can tell Left from Dead (see doc.go).
func encodeLeaveIntent(name, bootID, cluster string) []byte {
	b, _ := proto.Marshal(&pb.Hello{NodeName: name, BootId: bootID, Cluster: cluster}) // cannot fail for this message
	return append([]byte{msgLeaveIntent}, b...)
}

// decodeLeaveIntent parses a user message from the network.
func decodeLeaveIntent(b []byte) (*pb.Hello, error) {
	if len(b) == 0 || b[0] != msgLeaveIntent {
		return nil, fmt.Errorf("mesh: decode user message: %w: unknown kind", ErrBadMessage)
	}
	var h pb.Hello
	if err := proto.Unmarshal(bytes.Clone(b[1:]), &h); err != nil {
		return nil, fmt.Errorf("mesh: decode leave intent: %w: %w", ErrBadMessage, err)
	}
	if h.GetNodeName() == "" {
		return nil, fmt.Errorf("mesh: decode leave intent: %w: no node name", ErrBadMessage)
	}
	return &h, nil
}
