package admin

import "errors"

// Sentinels of the admin API. Check them with errors.Is.
var (
	// ErrBadConfig: Config.Validate refused the configuration.
	ErrBadConfig = errors.New("admin: bad config")
	// ErrBadRequest: a request body or query could not be decoded.
	ErrBadRequest = errors.New("admin: bad request")
	// ErrUnauthorized: a token is configured and the request lacks it.
	ErrUnauthorized = errors.New("admin: unauthorized")
	// ErrClosed: the server is closed.
	ErrClosed = errors.New("admin: closed")
)
