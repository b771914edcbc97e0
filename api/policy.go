package api

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// PolicyUpdate is the body of PUT and PATCH /v1/sessions/{name}/policy.
//
// PUT: Egress, Allow, Scope, LabPeers, Deny and OnDeny are the whole new
// policy (Egress "" is derived as at create, OnDeny "" is reject, the
// default at create); the
// revoke fields must be empty. PATCH: the entries of Allow, Scope,
// LabPeers and Deny are added, those of Revoke (an --allow or --scope
// entry, as inspect shows it or as it was given), RevokeLabPeers and
// RevokeDeny removed; Egress "" and OnDeny "" keep the current ones.
// Entries take the grammar, validation and one-line errors of create.
//
// Generation, when not 0, is the policy generation the caller read
// (SessionInfo.Policy.Generation): if the session's policy has changed
// since, the update is refused with ErrStaleGeneration and changes
// nothing. KeepEstablished leaves established flows to what the update
// revokes alone (by default they are cut).
type PolicyUpdate struct {
	Generation     uint64   `json:"generation,omitempty"`
	Egress         string   `json:"egress,omitempty"`
	Allow          []string `json:"allow,omitempty"`
	Scope          []string `json:"scope,omitempty"`
	LabPeers       []string `json:"lab_peers,omitempty"`
	Revoke         []string `json:"revoke,omitempty"`
	RevokeLabPeers []string `json:"revoke_lab_peers,omitempty"`
	Deny           []string `json:"deny,omitempty"`
	RevokeDeny     []string `json:"revoke_deny,omitempty"`
	OnDeny         string   `json:"on_deny,omitempty"`
	// NameCheck is "tls" or "off" (CreateRequest.NameCheck); "" keeps the
	// current one (PUT too: the check is not part of the entries).
	NameCheck string `json:"name_check,omitempty"`
	// QUIC is "refuse" or "check" (CreateRequest.QUIC); "" keeps the
	// current one, like NameCheck.
	QUIC            string `json:"quic,omitempty"`
	KeepEstablished bool   `json:"keep_established,omitempty"`
	// InboundFromHost (PATCH: added; PUT: the whole new list) and
	// RevokeInboundFromHost (PATCH only: removed) are ports the host may
	// open connections to, as CreateRequest.InboundFromHost.
	InboundFromHost       []string `json:"inbound_from_host,omitempty"`
	RevokeInboundFromHost []string `json:"revoke_inbound_from_host,omitempty"`
	// AllowFor makes this update's Allow entries a grant with an end, as
	// CreateRequest.AllowFor; KeepEstablished then also applies to the
	// grant's end.
	AllowFor string `json:"allow_for,omitempty"`
	// Connections and Budget make this update's Allow entries a grant
	// with a count or a byte budget, as CreateRequest's. A grant for an
	// entry that had one replaces its count (fresh) or its budget (what
	// was spent stays spent: raise the budget to let traffic flow again).
	Connections uint32 `json:"connections,omitempty"`
	Budget      uint64 `json:"budget,omitempty"`
	// EgressBudget, when not 0, sets the session's byte budget (raising
	// it lets traffic flow again; what was spent stays spent).
	EgressBudget uint64 `json:"egress_budget,omitempty"`
}

// PolicyEngine is the part of the Engine that changes a running
// session's policy. replace is true for PUT.
type PolicyEngine interface {
	UpdatePolicy(ctx context.Context, name string, u PolicyUpdate, replace bool) (SessionInfo, error)
}

var (
	// ErrStaleGeneration: the update named a policy generation that is no
	// longer the session's (someone else updated it meanwhile).
	ErrStaleGeneration = errors.New("stale policy generation")
	// ErrLocked: the session was created with --locked; its policy never
	// changes.
	ErrLocked = errors.New("session policy is locked")
)

func (a *server) policyPut(w http.ResponseWriter, r *http.Request)   { a.policyUpdate(w, r, true) }
func (a *server) policyPatch(w http.ResponseWriter, r *http.Request) { a.policyUpdate(w, r, false) }

func (a *server) policyUpdate(w http.ResponseWriter, r *http.Request, replace bool) {
	var u PolicyUpdate
	if err := decodeBody(w, r, &u); err != nil {
		writeRefusal(w, err)
		return
	}
	info, err := a.e.UpdatePolicy(r.Context(), r.PathValue("name"), u, replace)
	if err != nil {
		a.log.Info("policy update refused", "session", r.PathValue("name"), "err", err)
		a.fail(w, r, err)
		return
	}
	writeJSONStatus(w, http.StatusOK, info)
}

// UpdatePolicy adds and removes entries of a session's policy (PATCH).
func (c *Client) UpdatePolicy(ctx context.Context, name string, u PolicyUpdate) (SessionInfo, error) {
	var info SessionInfo
	err := c.call(ctx, http.MethodPatch, sessionPath(name)+"/policy", u, &info)
	return info, err
}

// ReplacePolicy makes u the whole policy of a session (PUT).
func (c *Client) ReplacePolicy(ctx context.Context, name string, u PolicyUpdate) (SessionInfo, error) {
	var info SessionInfo
	err := c.call(ctx, http.MethodPut, sessionPath(name)+"/policy", u, &info)
	return info, err
}

// PolicyChange is when and by whom a session's policy last changed.
type PolicyChange struct {
	Time time.Time `json:"time"`
	// By is the API caller that made the update (SO_PEERCRED), absent when
	// the daemon did not learn it.
	By *Caller `json:"by,omitempty"`
}
