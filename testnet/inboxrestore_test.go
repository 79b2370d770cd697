package testnet

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
)

// drainedTags waits until no outbox of c holds a message, then returns the
// "tag" of every message in daemon i's inbox box, in cursor order.
func drainedTags(t *testing.T, c *ProcCluster, i int, box string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.WaitDrained(ctx); err != nil {
		t.Fatal(err)
	}
	var tags []string
	for _, m := range pullAll(t, c, i, box) {
		var body struct{ Tag string }
		if err := json.Unmarshal(m.Body, &body); err != nil {
			t.Fatalf("cursor %d: %v", m.Cursor, err)
		}
		tags = append(tags, body.Tag)
	}
	return tags
}

// The daemon's outbox.db is lost and restored from a backup together with
// outbox.db.seq (the whole store as it was; restoring outbox.db alone, as
// its open error says, hands out no sequence again); inbox.db was not lost
// and is kept. The watermark of the node's stream to its own inbox goes
// back to the backup's (it lives in outbox.db), and so would the outbox's
// sequences but for the wall clock under each block of them: new local
// sends get sequences above every one handed out before the restore. (On a
// device whose clock tells nothing they reuse sequences the inbox stored,
// and taken for copies they would be told Delivered and stored nowhere:
// the inbox's record of what it stored is part of the stream's watermark
// when the node loads it, so the sender finds out its state went back and
// starts a new epoch; the node's tests cover that with such a clock.)
// Every message arrives.
func TestInboxTakesNewMessagesAfterTheOutboxIsRestored(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real meshnode daemon; runs without -short")
	}
	bin := buildMeshnode(t)
	c := NewProcs(t, bin, 1, WithInboxes("box"))
	to := "box@" + c.Name(0)
	send := func(tag string) string {
		out, err := c.Send(0, to, map[string]any{"tag": tag}, "")
		if err != nil {
			t.Fatalf("send %s: %v", tag, err)
		}
		return out
	}
	var sent []string
	for _, tag := range []string{"a1", "a2"} {
		t.Logf("%s: %s", tag, send(tag))
		sent = append(sent, tag)
	}
	if err := c.Stop(0); err != nil {
		t.Fatal(err)
	}
	ob := filepath.Join(c.DataDir(0), "outbox.db")
	backup := filepath.Join(t.TempDir(), "outbox.db.backup")
	testutil.CopyFile(t, ob, backup)               // the operator's backup of outbox.db
	testutil.CopyFile(t, ob+".seq", backup+".seq") // and of the sequence record beside it

	if err := c.Restart(0); err != nil {
		t.Fatal(err)
	}
	for _, tag := range []string{"a3", "a4", "a5"} {
		t.Logf("%s: %s", tag, send(tag))
		sent = append(sent, tag)
	}
	if err := c.Stop(0); err != nil {
		t.Fatal(err)
	}
	testutil.CopyFile(t, backup, ob) // outbox.db lost; restored from the backup, inbox.db kept
	testutil.CopyFile(t, backup+".seq", ob+".seq")

	if err := c.Restart(0); err != nil {
		t.Fatal(err)
	}
	for _, tag := range []string{"b1", "b2", "b3"} {
		t.Logf("%s: %s", tag, send(tag))
		sent = append(sent, tag)
	}
	if got := drainedTags(t, c, 0, "box"); !slices.Equal(got, sent) { // the b's may have been Queued
		t.Fatalf("inbox holds %v; sent (each told Delivered or Queued) %v", got, sent)
	}
}

// outbox.db lost and forgotten (doctor --forget) instead of restored: a
// new outbox id makes new local streams, which the inbox takes in full.
func TestInboxTakesNewMessagesAfterTheOutboxIsForgotten(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real meshnode daemon; runs without -short")
	}
	bin := buildMeshnode(t)
	c := NewProcs(t, bin, 1, WithInboxes("box"))
	to := "box@" + c.Name(0)
	var sent []string
	send := func(tag string) {
		if _, err := c.Send(0, to, map[string]any{"tag": tag}, ""); err != nil {
			t.Fatalf("send %s: %v", tag, err)
		}
		sent = append(sent, tag)
	}
	send("a1")
	send("a2")
	if err := c.Stop(0); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(c.DataDir(0), "outbox.db")); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "doctor", "--data-dir", c.DataDir(0), "--forget").CombinedOutput(); err != nil {
		t.Fatalf("doctor: %v\n%s", err, out)
	}
	if err := c.Restart(0); err != nil {
		t.Fatal(err)
	}
	send("b1")
	send("b2")
	if got := drainedTags(t, c, 0, "box"); !slices.Equal(got, sent) {
		t.Fatalf("inbox holds %v; sent %v", got, sent)
	}
}

// A remote sender n0's outbox.db is restored from a backup; the receiver
// n1 (inbox box) keeps its state. n0's new messages are queued while n1 is
// down (killed) and go out in one emission that reaches past n1's
// watermark. Restored alone, the outbox continues above the sequence
// record beside it, and its new messages have sequences of their own.
// Restored with that record's backup too, they still do, since each block
// of sequences starts no lower than the wall clock, which moved on since
// the backup. (With a clock that tells nothing, they would reuse the
// sequences of messages n1 stored after the backup, and the message under
// the watermark's sequence, or the watermark between two messages of the
// burst, gives the restore away; the node's tests cover that with such a
// clock.) Every message is stored once, in order.
func TestInboxTakesARestoredSendersBurstPastItsWatermark(t *testing.T) {
	if testing.Short() {
		t.Skip("real daemons")
	}
	bin := buildMeshnode(t)
	for _, v := range []struct {
		name              string
		withRecord, other bool
	}{
		{"outbox.db alone", false, false},
		{"with its sequence record", true, false},
		{"with its sequence record, the watermark's sequence to another inbox", true, true},
	} {
		t.Run(v.name, func(t *testing.T) { restoredBurst(t, bin, v.withRecord, v.other) })
	}
}

func restoredBurst(t *testing.T, bin string, withRecord, other bool) {
	c := NewProcs(t, bin, 2, WithInboxes("box", "box2"))
	to := "box@" + c.Name(1)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var sent []string
	sendTo := func(to, tag string) string {
		out, err := c.Send(0, to, map[string]any{"tag": tag}, "")
		if err != nil {
			t.Fatalf("send %s: %v", tag, err)
		}
		return out
	}
	send := func(tag string) string {
		sent = append(sent, tag)
		return sendTo(to, tag)
	}
	send("a1")
	send("a2")
	if err := c.Stop(0); err != nil {
		t.Fatal(err)
	}
	ob := filepath.Join(c.DataDir(0), "outbox.db")
	backup := filepath.Join(t.TempDir(), "outbox.db.backup")
	testutil.CopyFile(t, ob, backup)
	if withRecord {
		testutil.CopyFile(t, ob+".seq", backup+".seq")
	}
	if err := c.Restart(0); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tag := range []string{"a3", "a4", "a5"} { // a5: box's watermark
		t.Logf("%s: %s", tag, send(tag))
	}
	if err := c.WaitDrained(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(0); err != nil {
		t.Fatal(err)
	}
	testutil.CopyFile(t, backup, ob) // n0's outbox.db restored from the backup
	if withRecord {
		testutil.CopyFile(t, backup+".seq", ob+".seq")
	}
	if err := c.Kill(1); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(0); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 6; i++ {
		if other && i == 3 {
			// With the record restored and a clock that tells nothing,
			// this would take a5's sequence.
			t.Logf("o: %s", sendTo("box2@"+c.Name(1), "o"))
		}
		t.Logf("b%d: %s", i, send(fmt.Sprint("b", i)))
	}
	if err := c.Restart(1); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	// drainedTags waits until nothing is queued.
	if other {
		if got := drainedTags(t, c, 1, "box2"); !slices.Equal(got, []string{"o"}) {
			t.Fatalf("box2 holds %v, want [o]", got)
		}
	}
	if got := drainedTags(t, c, 1, "box"); !slices.Equal(got, sent) {
		t.Fatalf("inbox holds %v; sent (each told Delivered or Queued) %v", got, sent)
	}
}
