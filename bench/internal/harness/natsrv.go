package harness

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// natsServer is an embedded nats-server on a random loopback port.
type natsServer struct {
	s *server.Server
}

// startNATS starts nats-server; with jetStream it stores under dir/jetstream,
// fsyncing every write when syncAlways (else the server's default: a
// background sync every 2 minutes).
func (e *env) startNATS(jetStream, syncAlways bool, sub string) (*natsServer, error) {
	opts := &server.Options{
		Host:                   "127.0.0.1",
		Port:                   server.RANDOM_PORT,
		NoLog:                  true,
		NoSigs:                 true,
		JetStream:              jetStream,
		StoreDir:               filepath.Join(e.dir, sub, "jetstream"),
		SyncAlways:             syncAlways,
		DisableJetStreamBanner: true,
		MaxPayload:             1 << 20,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("bench: nats-server: %w", err)
	}
	go s.Start() // ends on Shutdown; close waits for it
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, fmt.Errorf("bench: nats-server not ready: %w", ErrTimeout)
	}
	return &natsServer{s: s}, nil
}

func (n *natsServer) connect() (*nats.Conn, error) {
	nc, err := nats.Connect(n.s.ClientURL(), nats.NoReconnect())
	if err != nil {
		return nil, fmt.Errorf("bench: nats connect: %w", err)
	}
	return nc, nil
}

func (n *natsServer) close() {
	n.s.Shutdown()
	n.s.WaitForShutdown()
}
