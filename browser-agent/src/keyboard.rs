//! Typing text on the VM's X display without changing the keyboard map under Chromium.
//!
//! X has no "type this character" request: a client presses keycodes, and the receiving
//! program turns them into characters with its copy of the keyboard map. enigo (like
//! xdotool) types a character missing from the map by binding it to a spare keycode just
//! before pressing that keycode, but Chromium takes a changed map asynchronously, so a
//! character pressed right after its binding is sometimes lost (measured: 3 rounds in 15
//! of a 47-character European text lost a character). Hence:
//!
//! 1. [`prepare`] runs once, as soon as Xvfb serves, while Chromium starts (it talks to X
//!    ~90 ms after its start; Xvfb serves ~30 ms after its own): it binds the letters and
//!    symbols of the Latin scripts outside ASCII to keycodes the VM's keyboard does not
//!    use (free ones and vendor launcher keys), lower and upper case on one key as on real
//!    keyboards. Chromium loads that map when it connects.
//! 2. [`Typist`] types each character with the keycode and shift level where the map has
//!    it: ASCII capitals and symbols use Shift, like a real keyboard, with no rebinding.
//! 3. Any other character is bound, when typed, to one of a few keycodes kept for that,
//!    and pressed after a pause that lets Chromium take the new map ([`SETTLE`]).

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::Context;
use x11rb::connection::Connection;
use x11rb::protocol::xproto::{
    ConnectionExt as _, KEY_PRESS_EVENT, KEY_RELEASE_EVENT, KeyButMask, Window,
};
use x11rb::protocol::xtest::ConnectionExt as _;
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;
use xkeysym::Keysym;

/// Characters bound by [`prepare`], most used first (what does not fit is bound when
/// typed). Each pair shares a key: the first without Shift, the second with it.
const PREPARED_PAIRS: &[&str] = &[
    // Latin-1 letters.
    "àÀ",
    "áÁ",
    "âÂ",
    "ãÃ",
    "äÄ",
    "åÅ",
    "æÆ",
    "çÇ",
    "èÈ",
    "éÉ",
    "êÊ",
    "ëË",
    "ìÌ",
    "íÍ",
    "îÎ",
    "ïÏ",
    "ðÐ",
    "ñÑ",
    "òÒ",
    "óÓ",
    "ôÔ",
    "õÕ",
    "öÖ",
    "øØ",
    "ùÙ",
    "úÚ",
    "ûÛ",
    "üÜ",
    "ýÝ",
    "þÞ",
    "ÿŸ",
    "ßẞ",
    // Latin-1 and typographic symbols.
    "€£",
    "¡¿",
    "«»",
    "‹›",
    "‘’",
    "“”",
    "‚„",
    "–—",
    "…•",
    "¥¢",
    "§¶",
    "©®",
    "°±",
    "²³",
    "¹ª",
    "º¼",
    "½¾",
    "×÷",
    "µ·",
    "¬¦",
    "¨´",
    "¸¯",
    "¤™",
    "\u{a0}\u{ad}",
    "†‰",
    // Latin Extended-A (and Romanian's comma-below letters).
    "āĀ",
    "ăĂ",
    "ąĄ",
    "ćĆ",
    "čČ",
    "ďĎ",
    "đĐ",
    "ēĒ",
    "ęĘ",
    "ěĚ",
    "ğĞ",
    "ģĢ",
    "īĪ",
    "ıİ",
    "ķĶ",
    "ĺĹ",
    "ļĻ",
    "ľĽ",
    "łŁ",
    "ńŃ",
    "ņŅ",
    "ňŇ",
    "őŐ",
    "œŒ",
    "ŕŔ",
    "řŘ",
    "śŚ",
    "şŞ",
    "šŠ",
    "ťŤ",
    "ūŪ",
    "ůŮ",
    "űŰ",
    "źŹ",
    "żŻ",
    "žŽ",
    "șȘ",
    "țȚ",
];

/// Launcher keys a page may still want (media and browser keys) keep their keycodes; the
/// other vendor keys (mail, calculator, brightness…) lend theirs to [`PREPARED_PAIRS`].
const KEPT_VENDOR_KEYSYMS: &[u32] = &[
    0x1008_ff11, // XF86AudioLowerVolume
    0x1008_ff12, // XF86AudioMute
    0x1008_ff13, // XF86AudioRaiseVolume
    0x1008_ff14, // XF86AudioPlay
    0x1008_ff15, // XF86AudioStop
    0x1008_ff16, // XF86AudioPrev
    0x1008_ff17, // XF86AudioNext
    0x1008_ff18, // XF86HomePage
    0x1008_ff1b, // XF86Search
    0x1008_ff26, // XF86Back
    0x1008_ff27, // XF86Forward
    0x1008_ff29, // XF86Refresh
    0x1008_ff31, // XF86AudioPause
    0x1008_ff73, // XF86Reload
];

/// Free keycodes left to enigo, which binds keys named in key presses that the map lacks
/// (and refuses to start without one).
const LEFT_FOR_ENIGO: usize = 4;
/// Keycodes kept for characters bound when typed.
const TYPING_POOL: usize = 6;
/// How long Chromium is given to take a changed map before the new key is pressed
/// (30 ms lost nothing in the measurement above; this leaves room for a loaded host).
pub const SETTLE: Duration = Duration::from_millis(60);

/// Holds keycodes of the typing pool until bound: not NoSymbol, so enigo leaves them be.
const PLACEHOLDER: u32 = 0x00ff_ffff; // VoidSymbol
const VENDOR_KEYSYMS: std::ops::RangeInclusive<u32> = 0x1008_ff00..=0x1008_ffff;

/// The keycodes [`prepare`] kept for characters bound when typed.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    typing_pool: Vec<u8>,
}

/// A copy of the server's core keyboard map.
#[derive(Clone)]
struct Keymap {
    min_keycode: u8,
    per_keycode: usize,
    keysyms: Vec<u32>,
}

impl Keymap {
    fn read(connection: &RustConnection) -> anyhow::Result<Self> {
        let setup = connection.setup();
        let (min_keycode, max_keycode) = (setup.min_keycode, setup.max_keycode);
        let reply = connection
            .get_keyboard_mapping(min_keycode, max_keycode - min_keycode + 1)?
            .reply()
            .context("reading the keyboard map")?;
        Ok(Self {
            min_keycode,
            per_keycode: usize::from(reply.keysyms_per_keycode),
            keysyms: reply.keysyms,
        })
    }

    fn keycodes(&self) -> impl Iterator<Item = u8> + '_ {
        let count = self.keysyms.len() / self.per_keycode.max(1);
        (0..count).filter_map(|index| u8::try_from(usize::from(self.min_keycode) + index).ok())
    }

    fn row(&self, keycode: u8) -> &[u32] {
        let start = usize::from(keycode - self.min_keycode) * self.per_keycode;
        &self.keysyms[start..start + self.per_keycode]
    }

    fn row_mut(&mut self, keycode: u8) -> &mut [u32] {
        let start = usize::from(keycode - self.min_keycode) * self.per_keycode;
        &mut self.keysyms[start..start + self.per_keycode]
    }

    /// Both levels of the first group, the way a two-level key is written in the core map.
    fn bind(&mut self, keycode: u8, lower: u32, upper: u32) {
        let row = self.row_mut(keycode);
        row.fill(0);
        for (column, keysym) in row.iter_mut().zip([lower, upper, lower, upper]) {
            *column = keysym;
        }
    }

    /// The keycode and level (0 plain, 1 shifted) that type `keysym`; plain first.
    fn find(&self, keysym: u32) -> Option<(u8, usize)> {
        (0..2.min(self.per_keycode)).find_map(|level| {
            self.keycodes()
                .find(|&keycode| self.row(keycode)[level] == keysym)
                .map(|keycode| (keycode, level))
        })
    }

    /// Writes rows `first..=last` to the server (one change, one notification to clients).
    fn write(&self, connection: &RustConnection, first: u8, last: u8) -> anyhow::Result<()> {
        let start = usize::from(first - self.min_keycode) * self.per_keycode;
        let end = usize::from(last - self.min_keycode + 1) * self.per_keycode;
        let per_keycode = u8::try_from(self.per_keycode).context("keysyms per keycode")?;
        connection
            .change_keyboard_mapping(
                last - first + 1,
                first,
                per_keycode,
                &self.keysyms[start..end],
            )?
            .check()
            .context("changing the keyboard map")
    }
}

/// Binds [`PREPARED_PAIRS`] on the display; to run before any other client connects.
pub fn prepare(display: &str) -> anyhow::Result<Layout> {
    let (connection, _) =
        RustConnection::connect(Some(display)).context("connecting to the X display")?;
    let original = Keymap::read(&connection)?;
    let mut keymap = original.clone();
    let free: Vec<u8> = keymap
        .keycodes()
        .filter(|&keycode| keymap.row(keycode).iter().all(|&keysym| keysym == 0))
        .collect();
    let vendor = keymap.keycodes().filter(|&keycode| {
        let row = keymap.row(keycode);
        row.iter().any(|&keysym| keysym != 0)
            && row.iter().all(|keysym| {
                *keysym == 0
                    || (VENDOR_KEYSYMS.contains(keysym) && !KEPT_VENDOR_KEYSYMS.contains(keysym))
            })
    });
    let mut lendable =
        free.iter().copied().skip(LEFT_FOR_ENIGO).chain(vendor).collect::<VecDeque<u8>>();
    let typing_pool: Vec<u8> = (0..TYPING_POOL).filter_map(|_| lendable.pop_front()).collect();
    for &keycode in &typing_pool {
        keymap.bind(keycode, PLACEHOLDER, PLACEHOLDER);
    }
    let mut unbound = 0;
    for pair in PREPARED_PAIRS {
        let mut characters = pair.chars().map(|c| Keysym::from_char(c).raw());
        let (Some(lower), Some(upper)) = (characters.next(), characters.next()) else {
            continue;
        };
        match lendable.pop_front() {
            Some(keycode) => keymap.bind(keycode, lower, upper),
            None => unbound += 1,
        }
    }
    if unbound > 0 {
        tracing::debug!(unbound, "keys left to bind when typed");
    }
    // One change from the first keycode touched to the last: rows between them are
    // written back as they were.
    let touched: Vec<u8> =
        keymap.keycodes().filter(|&keycode| keymap.row(keycode) != original.row(keycode)).collect();
    if let (Some(&first), Some(&last)) = (touched.first(), touched.last()) {
        keymap.write(&connection, first, last)?;
    }
    Ok(Layout { typing_pool })
}

/// Types characters with XTest on its own connection to the display.
pub struct Typist {
    connection: RustConnection,
    root: Window,
    keymap: Keymap,
    shift: u8,
    /// Pool keycodes, least recently bound first, with the keysym each carries.
    pool: VecDeque<(u8, u32)>,
}

impl Typist {
    pub fn new(display: &str, layout: &Layout) -> anyhow::Result<Self> {
        let (connection, screen) =
            RustConnection::connect(Some(display)).context("connecting to the X display")?;
        let root = connection.setup().roots[screen].root;
        let keymap = Keymap::read(&connection)?;
        let shift = keymap
            .find(Keysym::Shift_L.raw())
            .map(|(keycode, _)| keycode)
            .context("the keyboard has no Shift key")?;
        let pool =
            layout.typing_pool.iter().map(|&keycode| (keycode, keymap.row(keycode)[0])).collect();
        Ok(Self { connection, root, keymap, shift, pool })
    }

    /// Presses and releases the key of one character (Return for a line break), with Shift
    /// set as the character needs and put back as it was; the server has processed the
    /// events when this returns.
    pub fn type_char(&mut self, character: char) -> anyhow::Result<()> {
        let keysym = match character {
            '\n' | '\r' => Keysym::Return.raw(),
            '\t' => Keysym::Tab.raw(),
            other => Keysym::from_char(other).raw(),
        };
        if keysym == 0 {
            anyhow::bail!("{character:?} cannot be typed");
        }
        let (keycode, level) = match self.keymap.find(keysym) {
            Some(found) => found,
            None => (self.bind_in_pool(keysym)?, 0),
        };
        let row = self.keymap.row(keycode);
        let (plain, shifted) = (row[0], row.get(1).copied().unwrap_or(0));
        let shift_matters = shifted != 0 && shifted != plain;
        // Shift keys to toggle around the key: held ones go up for a plain character,
        // Shift goes down for a shifted one.
        let mut toggled_shift = Vec::new();
        let mut shift_down = false;
        if shift_matters {
            let mask = self.connection.query_pointer(self.root)?.reply()?.mask;
            shift_down = mask.contains(KeyButMask::SHIFT);
            // Caps Lock turns the level of letters (not of symbols) the other way.
            let letter = is_case_pair(plain, shifted);
            let level_now = usize::from(shift_down ^ (letter && mask.contains(KeyButMask::LOCK)));
            if level_now != level {
                toggled_shift = if shift_down { self.held_shift_keys()? } else { vec![self.shift] };
            }
        }
        let (toggle, restore) = if shift_down {
            (KEY_RELEASE_EVENT, KEY_PRESS_EVENT)
        } else {
            (KEY_PRESS_EVENT, KEY_RELEASE_EVENT)
        };
        for &key in &toggled_shift {
            self.fake(toggle, key)?;
        }
        self.fake(KEY_PRESS_EVENT, keycode)?;
        self.fake(KEY_RELEASE_EVENT, keycode)?;
        for &key in toggled_shift.iter().rev() {
            self.fake(restore, key)?;
        }
        self.connection.sync().context("typing on the X display")?;
        Ok(())
    }

    fn fake(&self, kind: u8, keycode: u8) -> anyhow::Result<()> {
        self.connection.xtest_fake_input(kind, keycode, 0, self.root, 0, 0, 0)?;
        Ok(())
    }

    /// The Shift keys down now.
    fn held_shift_keys(&self) -> anyhow::Result<Vec<u8>> {
        let pressed = self.connection.query_keymap()?.reply()?.keys;
        let shifts = [Keysym::Shift_L.raw(), Keysym::Shift_R.raw()];
        Ok(self
            .keymap
            .keycodes()
            .filter(|&keycode| {
                pressed[usize::from(keycode / 8)] & (1 << (keycode % 8)) != 0
                    && shifts.contains(&self.keymap.row(keycode)[0])
            })
            .collect())
    }

    /// Binds `keysym` to the pool keycode bound longest ago, and waits for Chromium.
    fn bind_in_pool(&mut self, keysym: u32) -> anyhow::Result<u8> {
        let (keycode, _) =
            self.pool.pop_front().context("no keycode is free for typing this character")?;
        self.keymap.bind(keycode, keysym, keysym);
        let written = self.keymap.write(&self.connection, keycode, keycode);
        self.pool.push_back((keycode, keysym));
        written?;
        std::thread::sleep(SETTLE);
        Ok(keycode)
    }
}

/// Whether two keysyms are the lower and upper case of one letter.
fn is_case_pair(lower: u32, upper: u32) -> bool {
    let (Some(lower), Some(upper)) = (Keysym::new(lower).key_char(), Keysym::new(upper).key_char())
    else {
        return false;
    };
    lower != upper && lower.to_uppercase().eq(std::iter::once(upper))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepared_pairs_are_pairs_of_typable_characters() {
        for pair in PREPARED_PAIRS {
            let characters: Vec<char> = pair.chars().collect();
            assert_eq!(characters.len(), 2, "{pair}");
            for character in characters {
                assert_ne!(Keysym::from_char(character).raw(), 0, "{character}");
            }
        }
        assert!(is_case_pair(Keysym::from_char('é').raw(), Keysym::from_char('É').raw()));
        assert!(is_case_pair(Keysym::from_char('ł').raw(), Keysym::from_char('Ł').raw()));
        assert!(!is_case_pair(Keysym::from_char('¡').raw(), Keysym::from_char('¿').raw()));
        assert!(!is_case_pair(Keysym::from_char('1').raw(), Keysym::from_char('!').raw()));
    }
}
