// Sign-in, shared by the service pages (inlined into each): the auth page sends the user back
// with the token in the fragment or the query; it is kept in sessionStorage for the tab.
// The page defines AUTH_UI (the auth page's address) and has an element #who.
function takeToken() {
  for (const src of [location.hash.slice(1), location.search.slice(1)]) {
    const p = new URLSearchParams(src);
    const t = p.get("serviceToken") || p.get("token");
    if (t) {
      sessionStorage.setItem("hearth.serviceToken", t);
      window.history.replaceState(null, "", location.pathname);
      return t;
    }
  }
  return sessionStorage.getItem("hearth.serviceToken");
}
const signInUrl = () => AUTH_UI + (AUTH_UI.includes("?") ? "&" : "?") + "callback=" + encodeURIComponent(location.origin + location.pathname);
let token = takeToken();

function showSignedIn() {
  const who = document.getElementById("who");
  who.textContent = "";
  if (token) {
    let user = "";
    try { user = JSON.parse(atob(token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/"))).sub || ""; } catch (_) {}
    who.textContent = user ? "signed in as " + user : "signed in";
  } else {
    const a = document.createElement("a");
    a.href = signInUrl(); a.textContent = "Sign in"; a.id = "signin";
    who.appendChild(a);
  }
}
// Forgets the token (sign-out, or a token the service refused).
function signOut() { sessionStorage.removeItem("hearth.serviceToken"); token = null; showSignedIn(); }
