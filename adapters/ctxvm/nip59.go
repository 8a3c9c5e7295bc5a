package ctxvm

import (
	"encoding/json"
	"errors"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip44"
)

// Encryption event kinds.
const (
	KindEphemeralGiftWrap = 21059 // KindGiftWrap that relays do not store
	KindSeal              = 13    // NIP-59 seal: a rumor encrypted and signed by its author
	KindRumorDM           = 14    // NIP-17 rumor whose content is an event template (DVMCP)
)

// wrapping is how a request came in, and how its answers go out.
type wrapping struct {
	kind    int  // 0: plaintext; KindGiftWrap or KindEphemeralGiftWrap
	nip59   bool // seal + rumor (DVMCP), not ContextVM's signed inner event
	rumor14 bool // the rumor was a kind 14 whose content is the event
}

// decrypt opens NIP-44 v2 ciphertext from sender to us.
func (s *Server) decrypt(sender, ciphertext string) (string, error) {
	ck, err := nip44.GenerateConversationKey(sender, s.cfg.SecretKey)
	if err != nil {
		return "", ErrUndecryptab
	}
	plain, err := nip44.Decrypt(ciphertext, ck)
	if err != nil {
		return "", ErrUndecryptab
	}
	return plain, nil
}

// unwrap opens a gift wrap (kind 1059 or 21059, id and signature already
// checked) and returns the request event inside, checked as far as its
// layer goes: ContextVM's signed event (any kind; id and signature
// verified), or, when the decrypted content is a kind 13 seal, the NIP-59
// rumor (see unseal). The request's own checks (kind, p tag, window,
// content) are parseRequest's.
func (s *Server) unwrap(w *nostr.Event) (*nostr.Event, wrapping, error) {
	plain, err := s.decrypt(w.PubKey, w.Content)
	if err != nil {
		return nil, wrapping{}, err
	}
	var inner nostr.Event
	if err := json.Unmarshal([]byte(plain), &inner); err != nil {
		return nil, wrapping{}, ErrUndecryptab
	}
	if len(inner.Content) > s.cfg.MaxContentBytes {
		return nil, wrapping{}, ErrTooLarge
	}
	if err := s.verify(&inner); err != nil {
		return nil, wrapping{}, err
	}
	if inner.Kind != KindSeal {
		return &inner, wrapping{kind: w.Kind}, nil
	}
	req, rumor14, err := s.unseal(&inner)
	if err != nil {
		return nil, wrapping{}, err
	}
	return req, wrapping{kind: w.Kind, nip59: true, rumor14: rumor14}, nil
}

// unseal opens a verified NIP-59 seal. The rumor inside must be by the
// seal's signer (else anyone could seal a rumor naming someone else) and
// carry its own id (the hash of its fields: it is the request id). A
// rumor of kind 14 holds the request as an event template in its content
// ({"kind", "tags", "content", ...}: the DVMCP packages' form); its id
// and pubkey stay the rumor's. Any other rumor is the request itself.
func (s *Server) unseal(seal *nostr.Event) (*nostr.Event, bool, error) {
	plain, err := s.decrypt(seal.PubKey, seal.Content)
	if err != nil {
		return nil, false, err
	}
	var rumor nostr.Event
	if err := json.Unmarshal([]byte(plain), &rumor); err != nil {
		return nil, false, ErrUndecryptab
	}
	if rumor.PubKey != seal.PubKey {
		return nil, false, ErrForgedRumor
	}
	if !rumor.CheckID() {
		return nil, false, ErrBadEvent
	}
	if len(rumor.Content) > s.cfg.MaxContentBytes {
		return nil, false, ErrTooLarge
	}
	rumor.Sig = ""
	if rumor.Kind != KindRumorDM {
		return &rumor, false, nil
	}
	var tmpl struct {
		Kind    int        `json:"kind"`
		Tags    nostr.Tags `json:"tags"`
		Content string     `json:"content"`
	}
	if err := json.Unmarshal([]byte(rumor.Content), &tmpl); err != nil || tmpl.Kind == 0 {
		return nil, false, ErrNotJSONRPC
	}
	req := rumor
	req.Kind, req.Tags, req.Content = tmpl.Kind, tmpl.Tags, tmpl.Content
	return &req, true, nil
}

// giftWrap encrypts a signed event (ContextVM) or a seal (NIP-59) to
// recipient in a gift wrap of kind (1059 or 21059) signed by a fresh key,
// tagged p, created_at now: clients subscribe since the time they sent
// the request, so NIP-59's randomized timestamps would hide the answer.
func (s *Server) giftWrap(ev nostr.Event, recipient string, kind int) (nostr.Event, error) {
	sk := nostr.GeneratePrivateKey()
	ck, err := nip44.GenerateConversationKey(recipient, sk)
	if err != nil {
		return nostr.Event{}, errors.New("bad recipient pubkey")
	}
	ct, err := nip44.Encrypt(ev.String(), ck)
	if err != nil {
		return nostr.Event{}, err
	}
	w := nostr.Event{Kind: kind, CreatedAt: nostr.Timestamp(s.cfg.Now().Unix()), Tags: nostr.Tags{{"p", recipient}}, Content: ct}
	if err := w.Sign(sk); err != nil {
		return nostr.Event{}, errors.New("signing the gift wrap failed")
	}
	return w, nil
}

// seal makes the NIP-59 seal of an answer: the unsigned rumor (our
// pubkey, its id set; a kind 14 carrying the answer as a template when
// the request came so) NIP-44 encrypted from our key to recipient, in a
// kind 13 event signed by us.
func (s *Server) seal(ans nostr.Event, recipient string, rumor14 bool) (nostr.Event, error) {
	rumor := nostr.Event{PubKey: s.pk, CreatedAt: ans.CreatedAt, Kind: ans.Kind, Tags: ans.Tags, Content: ans.Content}
	if rumor14 {
		rumor.Content = marshal(struct {
			Kind      int             `json:"kind"`
			PubKey    string          `json:"pubkey"`
			CreatedAt nostr.Timestamp `json:"created_at"`
			Tags      nostr.Tags      `json:"tags"`
			Content   string          `json:"content"`
		}{ans.Kind, s.pk, ans.CreatedAt, ans.Tags, ans.Content})
		rumor.Kind, rumor.Tags = KindRumorDM, nostr.Tags{{"p", recipient}}
	}
	rumor.ID = rumor.GetID()
	ck, err := nip44.GenerateConversationKey(recipient, s.cfg.SecretKey)
	if err != nil {
		return nostr.Event{}, errors.New("bad recipient pubkey")
	}
	ct, err := nip44.Encrypt(rumor.String(), ck)
	if err != nil {
		return nostr.Event{}, err
	}
	seal := nostr.Event{Kind: KindSeal, CreatedAt: ans.CreatedAt, Tags: nostr.Tags{}, Content: ct}
	if err := s.sign(&seal); err != nil {
		return nostr.Event{}, errors.New("signing the seal failed")
	}
	return seal, nil
}

// answerWrapKind is the gift wrap kind of answers to a request that came
// wrapped: 21059 when the client said it takes them (a
// support_encryption_ephemeral tag on its request), else 1059.
func answerWrapKind(req *nostr.Event) int {
	if t := findTag(req.Tags, tagEphemeral); t != nil && (len(t) < 2 || t[1] != "false") {
		return KindEphemeralGiftWrap
	}
	return KindGiftWrap
}
