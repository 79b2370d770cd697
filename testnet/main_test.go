package testnet

import (
	"testing"

	"github.com/meshnode/meshnode/internal/testutil"
)

func TestMain(m *testing.M) { testutil.VerifyTestMain(m) }
