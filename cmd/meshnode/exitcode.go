package main

import (
	"errors"
	"fmt"

	"github.com/meshnode/meshnode/internal/admin"
	"github.com/spf13/cobra"
)

// Exit codes: scripts retry on exitUnreachable, exitCapacity and
// exitTimeout (10 and up), and give up on the others. README.md has the
// same table; TestExitCodesDocumented keeps the two in step.
const (
	exitOK          = 0  // success
	exitFailure     = 1  // a failure not listed below: the daemon's internal error, a local I/O error, a declined confirmation
	exitUsage       = 2  // unknown command or flag, wrong arguments, an invalid value, or no confirmation could be had
	exitConfig      = 3  // `run` could not start: bad config, missing certificate, address in use, data directory in use
	exitRefused     = 4  // permanent: the daemon refused the request (bad request, unauthorized, conflict)
	exitNotFound    = 5  // permanent: no such actor, inbox or dead letter
	exitRemote      = 6  // the recipient's handler failed
	exitUnreachable = 10 // retryable: the daemon or the recipient node could not be reached
	exitCapacity    = 11 // retryable: the recipient is full; try again later
	exitTimeout     = 12 // retryable: no answer before the deadline
)

// exitCodes is the table printed by `meshnode help exit-codes` and in the
// README, in order.
var exitCodes = []struct {
	code int
	name string
	what string
}{
	{exitOK, "ok", "success"},
	{exitFailure, "failure", "a failure not listed below: the daemon's internal error, a local I/O error, a declined confirmation"},
	{exitUsage, "usage", "unknown command or flag, wrong arguments, an invalid value (e.g. --ttl -1s), or no confirmation could be had (dlq purge without a terminal and without --yes)"},
	{exitConfig, "config", "run could not start: bad config, missing certificate, address in use, data directory used by another meshnode"},
	{exitRefused, "refused", "permanent: the daemon refused the request (bad request, unauthorized, conflict such as an ack past the stored messages)"},
	{exitNotFound, "not found", "permanent: no such actor, inbox or dead letter"},
	{exitRemote, "remote", "the recipient's handler returned an error"},
	{exitUnreachable, "unreachable", "retryable: the daemon (is it running? --admin) or the recipient node could not be reached"},
	{exitCapacity, "capacity", "retryable: the recipient is full; try again after the hint in the message"},
	{exitTimeout, "timeout", "retryable: no answer before the deadline (ask --timeout, --http-timeout)"},
}

// exitError carries an exit code with the error the user sees.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func withCode(code int, err error) error {
	if err == nil {
		return nil
	}
	return &exitError{code: code, err: err}
}

// usagef is a usage error (exit 2).
func usagef(format string, args ...any) error {
	return withCode(exitUsage, fmt.Errorf(format, args...))
}

// exitCode is the process's exit status for err.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if errors.Is(err, errBadConfig) {
		return exitConfig
	}
	return exitFailure
}

// codeOfAPI maps the admin API's error code to an exit code.
func codeOfAPI(code string) int {
	switch code {
	case admin.CodeBadRequest, admin.CodeUnauthorized, admin.CodeConflict:
		return exitRefused
	case admin.CodeNotFound:
		return exitNotFound
	case admin.CodeRemote:
		return exitRemote
	case admin.CodeUnreachable:
		return exitUnreachable
	case admin.CodeCapacity:
		return exitCapacity
	case admin.CodeTimeout:
		return exitTimeout
	}
	return exitFailure
}

// strictArgs makes every command refuse what it does not know with a usage
// error: a group (a command with subcommands) refuses an unknown
// subcommand instead of printing help and exiting 0, and argument and flag
// errors exit 2.
func strictArgs(c *cobra.Command) {
	c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return withCode(exitUsage, err) })
	if c.HasSubCommands() {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown command %q for %q (see %s --help)", args[0], cmd.CommandPath(), cmd.CommandPath())
			}
			return nil
		}
		if c.RunE == nil && c.Run == nil {
			c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
		}
		for _, sub := range c.Commands() {
			strictArgs(sub)
		}
		return
	}
	if check := c.Args; check != nil {
		c.Args = func(cmd *cobra.Command, args []string) error { return withCode(exitUsage, check(cmd, args)) }
	}
}
