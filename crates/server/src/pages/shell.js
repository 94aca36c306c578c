// The shell every page shares (pages::render inlines it before the page's own script). The
// sign-in page sends the user back with the service token in the fragment (or the query); it is
// kept in sessionStorage for the tab. The header shows who is signed in (the token's `sub`) and
// their balance (POST /balance on the auth service), and its links to the other pages carry the
// token along in their fragment, as the sign-in page's links do.
"use strict";
const hearth = (() => {
  const shell = JSON.parse(document.getElementById("hearth-shell").textContent);
  const KEY = "hearth.serviceToken";
  const el = (id) => document.getElementById(id);
  let token = take();
  let shown = 0; // counts balances shown, so that a late answer never overwrites a newer one

  function take() {
    for (const src of [location.hash.slice(1), location.search.slice(1)]) {
      const p = new URLSearchParams(src);
      const t = p.get("serviceToken") || p.get("token");
      if (t) {
        sessionStorage.setItem(KEY, t);
        window.history.replaceState(null, "", location.pathname);
        return t;
      }
    }
    return sessionStorage.getItem(KEY);
  }

  function user() {
    try {
      return JSON.parse(atob(token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/"))).sub || "";
    } catch (_) {
      return "";
    }
  }

  const signInUrl = () => shell.authUi + (shell.authUi.includes("?") ? "&" : "?") +
    "callback=" + encodeURIComponent(location.origin + location.pathname);

  function show() {
    const who = el("who");
    who.replaceChildren();
    if (token) {
      const u = user();
      who.textContent = u ? "signed in as " + u : "signed in";
    } else if (shell.authUi && shell.service !== "auth") {
      const a = document.createElement("a");
      a.href = signInUrl(); a.textContent = "Sign in"; a.id = "signin";
      who.appendChild(a);
    }
    el("account-balance").hidden = !token || !shell.balanceUrl;
    el("signout").hidden = !token || shell.service === "auth";
    const fragment = token ? "#serviceToken=" + encodeURIComponent(token) : "";
    for (const a of document.querySelectorAll(".services a[data-service]")) {
      a.href = a.dataset.href + (a.dataset.service === shell.service ? "" : fragment);
    }
  }

  function showBalance(balance) {
    shown++;
    el("balance").textContent = balance;
  }

  async function refreshBalance() {
    if (!token || !shell.balanceUrl) return;
    const ticket = ++shown;
    try {
      const res = await fetch(shell.balanceUrl, {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ serviceToken: token }),
      });
      const body = await res.json().catch(() => ({}));
      if (ticket !== shown) return;
      if (res.ok) el("balance").textContent = body.balance;
      else if (res.status === 401) signOut();
    } catch (_) {
      // The auth service cannot be reached: the balance stays unknown.
    }
  }

  // Keeps a token for the tab (the sign-in page, after signing in).
  function signIn(t) {
    sessionStorage.setItem(KEY, t); token = t; show(); refreshBalance();
  }
  // Forgets the token (sign-out, or a token a service refused).
  function signOut() {
    sessionStorage.removeItem(KEY); token = null; shown++;
    el("balance").textContent = "—"; show();
  }

  el("signout").addEventListener("click", signOut);
  show();
  refreshBalance();
  return { token: () => token, signInUrl, signIn, signOut, showBalance, refreshBalance };
})();
